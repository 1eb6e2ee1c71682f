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
  json j;
  j["format"] = "troupe-weights/1";
  j["version"] = version;
  j["payload_bytes"] = payload_size(ps);
  auto arr = json::array();
  for (const auto& p : ps)
    arr.push_back({{"name", p.e.name},
                   {"dtype", p.e.dtype},
                   {"shape", p.e.shape},
                   {"offset", p.e.offset},
                   {"bytes", p.e.bytes},
                   {"hash", hex64(p.e.hash)}});
  j["tensors"] = std::move(arr);
  return j.dump();
}

// Parses and checks a table: known dtypes, sizes that match the shapes,
// ranges inside the payload, no overlaps.
expected<table> decode_table(std::string_view text, const std::string& where) {
  auto bad = [&](const std::string& what) {
    return make_error(errc::corrupted, where + ": weight table: " + what);
  };
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    return bad(std::string{"not JSON ("} + e.what() + ")");
  }
  table t;
  try {
    if (!j.is_object() || j.value("format", "") != "troupe-weights/1")
      return bad("missing format \"troupe-weights/1\"");
    t.version = j.at("version").get<int64_t>();
    t.payload_bytes = j.at("payload_bytes").get<uint64_t>();
    uint64_t end_of_previous = 0;
    for (const auto& e : j.at("tensors")) {
      entry x;
      x.name = e.at("name").get<std::string>();
      x.dtype = e.at("dtype").get<std::string>();
      x.shape = e.at("shape").get<std::vector<int64_t>>();
      x.offset = e.at("offset").get<uint64_t>();
      x.bytes = e.at("bytes").get<uint64_t>();
      if (!parse_hex64(e.at("hash").get<std::string>(), x.hash))
        return bad("tensor '" + x.name + "': hash is not 16 hex digits");
      auto type = safetensors_scalar_type(x.dtype);
      if (!type)
        return bad("tensor '" + x.name + "': unknown dtype '" + x.dtype + "'");
      uint64_t numel = 1;
      for (auto d : x.shape) {
        if (d < 0)
          return bad("tensor '" + x.name + "': negative dimension");
        numel *= static_cast<uint64_t>(d);
      }
      if (numel * safetensors_dtype_size(x.dtype) != x.bytes)
        return bad("tensor '" + x.name + "': " + std::to_string(x.bytes) +
                   " bytes do not match its shape and dtype");
      if (x.offset < end_of_previous || x.offset > t.payload_bytes ||
          x.bytes > t.payload_bytes - x.offset)
        return bad("tensor '" + x.name + "': bytes [" + std::to_string(x.offset) + ", " +
                   std::to_string(x.offset + x.bytes) + ") overlap another tensor or lie outside the " +
                   std::to_string(t.payload_bytes) + "-byte payload");
      end_of_previous = x.offset + x.bytes;
      t.entries.push_back(std::move(x));
    }
  } catch (const json::exception& e) {
    return bad(std::string{"malformed ("} + e.what() + ")");
  }
  return t;
}

caf::error check_version(const table& t, int64_t expected_version, const std::string& where) {
  if (t.version == expected_version)
    return {};
  return make_error(errc::version_mismatch,
                    where + ": holds version " + std::to_string(t.version) + ", expected " +
                        std::to_string(expected_version) +
                        (t.version < expected_version ? " (stale)" : " (already overwritten)"));
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

caf::error check_new_version(int64_t version, int64_t last, const std::string& where) {
  if (version < 0)
    return make_error(errc::invalid_argument,
                      where + ": version " + std::to_string(version) + " is negative");
  if (version <= last)
    return make_error(errc::version_mismatch, where + ": version " + std::to_string(version) +
                                                  " is not above the last published version " +
                                                  std::to_string(last));
  return {};
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
