// The table every weight transfer carries, its codec and checks, and the OS
// helpers the transports share (runtime/transport_detail.hpp).
#include "runtime/transport_detail.hpp"

#include "runtime/hash.hpp"
#include "runtime/torch_guard.hpp"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include <sys/file.h>

namespace troupe::runtime::transport_detail {

using json = nlohmann::json;

uint64_t align_up(uint64_t x, uint64_t a) {
  return (x + a - 1) / a * a;
}

// ---- the table every transfer carries ------------------------------------------

expected<std::vector<prepared>> prepare(const tensor_map& tensors, const std::string& where) {
  std::vector<prepared> out;
  out.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (!t.defined())
      return make_error(errc::invalid_argument, where + ": tensor '" + name + "' is undefined");
    auto dtype = safetensors_dtype_name(t.scalar_type());
    if (dtype.empty())
      return make_error(errc::unsupported, where + ": tensor '" + name + "' has dtype " +
                                               std::string{c10::toString(t.scalar_type())} +
                                               ", which has no safetensors name");
    auto cpu = guarded(where + ": tensor '" + name + "'",
                       [&] { return t.detach().to(at::kCPU).contiguous(); });
    if (!cpu)
      return cpu.error();
    prepared p;
    p.e.name = name;
    p.e.dtype = dtype;
    p.e.shape.assign(t.sizes().begin(), t.sizes().end());
    p.e.bytes = static_cast<uint64_t>(cpu->numel()) * cpu->element_size();
    offset = align_up(offset, data_alignment);
    p.e.offset = offset;
    offset += p.e.bytes;
    p.cpu = std::move(*cpu);
    out.push_back(std::move(p));
  }
  return out;
}

uint64_t payload_size(const std::vector<prepared>& ps) {
  return ps.empty() ? 0 : ps.back().e.offset + ps.back().e.bytes;
}

// Copies every tensor into `payload` at its offset, filling in the hashes.
void copy_in(std::vector<prepared>& ps, uint8_t* payload) {
  for (auto& p : ps)
    p.e.hash = hash64_copy(payload + p.e.offset, p.cpu.data_ptr(), p.e.bytes);
}

std::string encode_table(int64_t version, const std::vector<prepared>& ps) {
  table t;
  t.version = version;
  t.payload_bytes = payload_size(ps);
  t.entries.reserve(ps.size());
  for (const auto& p : ps)
    t.entries.push_back(p.e);
  return encode_table(t);
}

// Verifies each tensor's hash over `payload` (payload_bytes long) and makes
// views of it; `keepalive` lives as long as any view.
expected<received_weights> verify_and_view(const table& t, const uint8_t* payload,
                                           std::shared_ptr<void> keepalive,
                                           const std::string& where) {
  received_weights out;
  out.version = t.version;
  for (const auto& e : t.entries) {
    if (hash64(payload + e.offset, e.bytes) != e.hash)
      return make_error(errc::corrupted, where + ": version " + std::to_string(t.version) +
                                             ": tensor '" + e.name +
                                             "' does not match its checksum");
    auto type = *safetensors_scalar_type(e.dtype);
    auto keep = keepalive;
    auto view = guarded(where + ": tensor '" + e.name + "'", [&] {
      return at::from_blob(const_cast<uint8_t*>(payload + e.offset), e.shape,
                           [keep](void*) mutable { keep.reset(); },
                           at::TensorOptions().dtype(type).device(at::kCPU));
    });
    if (!view)
      return view.error();
    out.bytes += e.bytes;
    out.tensors.emplace(e.name, std::move(*view));
  }
  return out;
}

caf::error os_error(const std::string& what) {
  return make_error(errc::io_error, what + ": " + std::strerror(errno));
}

// Takes flock(op) on `fd`, retrying until `timeout_ms`.
bool lock_within(int fd, int op, int64_t timeout_ms) {
  auto deadline = clock_type::now() + std::chrono::milliseconds(timeout_ms);
  auto pause = std::chrono::microseconds(50);
  while (true) {
    if (::flock(fd, op | LOCK_NB) == 0)
      return true;
    if (errno != EWOULDBLOCK && errno != EINTR)
      return false;
    if (clock_type::now() >= deadline)
      return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(5000));
  }
}

} // namespace troupe::runtime::transport_detail
