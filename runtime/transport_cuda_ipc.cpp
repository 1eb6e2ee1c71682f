// The cuda_ipc weight transport (compiled when CUDA is found; runs where a
// GPU is). NOTE [cuda ipc transfers]: the publisher copies a version's
// tensors into one device buffer of its own (cudaMalloc, every tensor at a
// 256-byte aligned offset, zero padded), exports a CUDA IPC handle for it
// and publishes a table — the handle, device, and per tensor its name,
// dtype, shape, offset and checksum — through an shm transport of the same
// channel (so the table is versioned and checksummed like any shm
// transfer). A receiver opens the handle and wraps the tensors around the
// mapped memory without a copy; it recomputes each checksum (the int64 sum
// of the tensor's 32-bit words, on the device) and refuses a mismatch.
// There are keep + 1 device buffers: while a reader holds version v - keep,
// its table slot blocks the shm publish of v, and the buffer of v is not v -
// keep's.
#include "runtime/transport_detail.hpp"

#include "runtime/torch_guard.hpp"

#include <ATen/ATen.h>
#include <cuda_runtime_api.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

namespace troupe::runtime {

namespace {

constexpr int64_t alignment = 256;

std::string cuda_error(const char* what, cudaError_t e) {
  return std::string{what} + ": " + cudaGetErrorString(e);
}

// The checksum of `bytes` bytes at the start of `words` (a padded int32 view).
int64_t device_checksum(const at::Tensor& words) {
  return words.sum(at::kLong).item<int64_t>();
}

std::string to_hex(const cudaIpcMemHandle_t& h) {
  std::string out;
  char b[3];
  for (unsigned char c : h.reserved) {
    std::snprintf(b, sizeof b, "%02x", c);
    out += b;
  }
  return out;
}

expected<cudaIpcMemHandle_t> from_hex(const std::string& s) {
  cudaIpcMemHandle_t h{};
  if (s.size() != 2 * sizeof h.reserved)
    return make_error(errc::corrupted, "cuda_ipc: the table's handle has " + std::to_string(s.size()) +
                                           " hex digits");
  for (size_t i = 0; i < sizeof h.reserved; ++i)
    h.reserved[i] = static_cast<char>(std::stoi(s.substr(2 * i, 2), nullptr, 16));
  return h;
}

// An opened handle; closed when the last tensor made from it goes.
struct mapping {
  void* base = nullptr;
  received_weights table; // keeps the table's shm slot held meanwhile
  ~mapping() {
    if (base)
      cudaIpcCloseMemHandle(base);
  }
};

class cuda_ipc_transport final : public weight_transport {
public:
  cuda_ipc_transport(transport_options o, std::unique_ptr<weight_transport> table)
    : opts_(std::move(o)), table_(std::move(table)), buffers_(static_cast<size_t>(opts_.keep) + 1) {}

  ~cuda_ipc_transport() override {
    for (auto& b : buffers_)
      if (b.ptr)
        cudaFree(b.ptr);
  }

  transport_kind kind() const override { return transport_kind::cuda_ipc; }

  expected<void> publish(int64_t version, const tensor_map& tensors) override {
    int device = -1;
    int64_t total = 0;
    for (const auto& [name, t] : tensors) {
      if (!t.is_cuda())
        return make_error(errc::invalid_argument,
                          "cuda_ipc publish: tensor " + name + " is on " + t.device().str() +
                              "; this transport carries CUDA tensors (use shm for CPU weights)");
      if (device >= 0 && t.get_device() != device)
        return make_error(errc::invalid_argument, "cuda_ipc publish: tensors on several devices");
      device = t.get_device();
      total += (t.numel() * static_cast<int64_t>(t.element_size()) + alignment - 1) / alignment * alignment;
    }
    if (device < 0)
      return make_error(errc::invalid_argument, "cuda_ipc publish: no tensors");
    if (auto e = cudaSetDevice(device); e != cudaSuccess)
      return make_error(errc::io_error, cuda_error("cuda_ipc publish: cudaSetDevice", e));
    auto& buf = buffers_[static_cast<size_t>(version % static_cast<int64_t>(buffers_.size()))];
    if (buf.bytes < total || buf.device != device) {
      if (buf.ptr)
        cudaFree(buf.ptr);
      buf = {};
      if (auto e = cudaMalloc(&buf.ptr, static_cast<size_t>(total)); e != cudaSuccess)
        return make_error(errc::io_error, cuda_error("cuda_ipc publish: cudaMalloc", e));
      buf.bytes = total;
      buf.device = device;
      if (auto e = cudaIpcGetMemHandle(&buf.handle, buf.ptr); e != cudaSuccess)
        return make_error(errc::io_error, cuda_error("cuda_ipc publish: cudaIpcGetMemHandle", e));
    }
    auto table = guarded("cuda_ipc publish", [&]() -> expected<nlohmann::json> {
      auto flat = at::from_blob(buf.ptr, {buf.bytes}, at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device));
      flat.zero_();
      nlohmann::json j = {{"version", version}, {"device", device}, {"bytes", total},
                          {"handle", to_hex(buf.handle)}};
      int64_t offset = 0;
      for (const auto& [name, t] : tensors) {
        auto n = t.numel() * static_cast<int64_t>(t.element_size());
        auto padded = (n + alignment - 1) / alignment * alignment;
        auto dst = flat.narrow(0, offset, n);
        dst.copy_(t.contiguous().view({-1}).view(at::kByte));
        std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
        j["tensors"].push_back({{"name", name}, {"dtype", std::string{c10::toString(t.scalar_type())}},
                                {"shape", shape}, {"offset", offset}, {"bytes", n},
                                {"sum", device_checksum(flat.narrow(0, offset, padded).view(at::kInt))}});
        offset += padded;
      }
      if (auto e = cudaDeviceSynchronize(); e != cudaSuccess)
        return make_error(errc::io_error, cuda_error("cuda_ipc publish: synchronize", e));
      return j;
    });
    if (!table)
      return table.error();
    auto text = table->dump();
    auto bytes = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
    std::memcpy(bytes.data_ptr(), text.data(), text.size());
    return table_->publish(version, {{"cuda_ipc.table", bytes}});
  }

  expected<received_weights> receive(int64_t version) override {
    auto got = table_->receive(version);
    if (!got)
      return got.error();
    auto it = got->tensors.find("cuda_ipc.table");
    if (it == got->tensors.end())
      return make_error(errc::corrupted, "cuda_ipc receive " + std::to_string(version) + ": no table");
    auto j = nlohmann::json::parse(std::string(static_cast<const char*>(it->second.data_ptr()),
                                               static_cast<size_t>(it->second.numel())),
                                   nullptr, false);
    if (j.is_discarded() || j.value("version", int64_t{-1}) != version)
      return make_error(errc::corrupted, "cuda_ipc receive " + std::to_string(version) + ": malformed table");
    auto handle = from_hex(j.value("handle", std::string{}));
    if (!handle)
      return handle.error();
    int device = j.value("device", 0);
    if (auto e = cudaSetDevice(device); e != cudaSuccess)
      return make_error(errc::io_error, cuda_error("cuda_ipc receive: cudaSetDevice", e));
    auto m = std::make_shared<mapping>();
    if (auto e = cudaIpcOpenMemHandle(&m->base, *handle, cudaIpcMemLazyEnablePeerAccess); e != cudaSuccess)
      return make_error(errc::io_error, cuda_error("cuda_ipc receive: cudaIpcOpenMemHandle", e));
    m->table = std::move(*got);
    return guarded("cuda_ipc receive", [&]() -> expected<received_weights> {
      received_weights out;
      out.version = version;
      auto total = j.value("bytes", int64_t{0});
      auto flat = at::from_blob(m->base, {total}, [m](void*) {},
                                at::TensorOptions().dtype(at::kByte).device(at::kCUDA, device));
      for (const auto& e : j["tensors"]) {
        auto name = e.value("name", std::string{});
        auto offset = e.value("offset", int64_t{0});
        auto n = e.value("bytes", int64_t{0});
        auto padded = (n + alignment - 1) / alignment * alignment;
        if (offset < 0 || n < 0 || offset + padded > total)
          return make_error(errc::corrupted, "cuda_ipc receive " + std::to_string(version) + ": tensor " +
                                                 name + " lies outside the buffer");
        if (device_checksum(flat.narrow(0, offset, padded).view(at::kInt)) != e.value("sum", int64_t{0}))
          return make_error(errc::corrupted, "cuda_ipc receive " + std::to_string(version) + ": tensor " +
                                                 name + " fails its checksum");
        auto dtype = e.value("dtype", std::string{});
        at::ScalarType st = at::kFloat;
        bool known = false;
        for (auto cand : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble, at::kLong, at::kInt, at::kByte,
                          at::kChar, at::kShort, at::kBool})
          if (dtype == c10::toString(cand)) {
            st = cand;
            known = true;
          }
        if (!known)
          return make_error(errc::corrupted, "cuda_ipc receive: tensor " + name + " has dtype '" + dtype + "'");
        std::vector<int64_t> shape = e.value("shape", std::vector<int64_t>{});
        auto t = flat.narrow(0, offset, n).view(st).view(shape);
        out.bytes += static_cast<uint64_t>(n);
        out.tensors.emplace(name, t);
      }
      return out;
    });
  }

private:
  struct device_buffer {
    void* ptr = nullptr;
    int64_t bytes = 0;
    int device = -1;
    cudaIpcMemHandle_t handle{};
  };
  transport_options opts_;
  std::unique_ptr<weight_transport> table_;
  std::vector<device_buffer> buffers_;
};

} // namespace

namespace transport_detail {

expected<std::unique_ptr<weight_transport>> make_cuda_ipc_transport(
  const transport_options& options, std::unique_ptr<weight_transport> table_channel) {
  return std::unique_ptr<weight_transport>(new cuda_ipc_transport(options, std::move(table_channel)));
}

} // namespace transport_detail

} // namespace troupe::runtime
