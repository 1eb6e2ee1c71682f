#include "runtime/weight_table.hpp"

#include "runtime/hash.hpp"
#include "runtime/jsonl.hpp"
#include "runtime/safetensors_header.hpp"

#include <nlohmann/json.hpp>

#include <cstring>
#include <stdexcept>
#include <type_traits>

namespace troupe::runtime::transport_detail {

using json = nlohmann::json;

std::string encode_table(const table& t) {
  json j;
  j["format"] = "troupe-weights/1";
  j["version"] = t.version;
  j["payload_bytes"] = t.payload_bytes;
  auto arr = json::array();
  for (const auto& e : t.entries)
    arr.push_back({{"name", e.name},
                   {"dtype", e.dtype},
                   {"shape", e.shape},
                   {"offset", e.offset},
                   {"bytes", e.bytes},
                   {"hash", hex64(e.hash)}});
  j["tensors"] = std::move(arr);
  return j.dump();
}

namespace {

// A table's integers are JSON integers: a float such as 6.8e32 converted to
// an integer would be undefined behaviour (found by the weight_table fuzz
// target).
struct not_an_integer : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class T>
T integer_at(const json& object, const char* key) {
  const auto& v = object.at(key);
  if (!v.is_number_integer() || (std::is_unsigned_v<T> && !v.is_number_unsigned()))
    throw not_an_integer{std::string{"'"} + key + "' is not a" +
                         (std::is_unsigned_v<T> ? " non-negative" : "n") + " integer"};
  return v.get<T>();
}

} // namespace

// Parses and checks a table: known dtypes, sizes that match the shapes,
// ranges inside the payload, no overlaps.
expected<table> decode_table(std::string_view text, const std::string& where) {
  auto bad = [&](const std::string& what) {
    return make_error(errc::corrupted, where + ": weight table: " + what);
  };
  if (auto at = json_too_deep_at(text); at != std::string_view::npos)
    return json_too_deep(where + ": weight table", at);
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
    t.version = integer_at<int64_t>(j, "version");
    t.payload_bytes = integer_at<uint64_t>(j, "payload_bytes");
    uint64_t end_of_previous = 0;
    for (const auto& e : j.at("tensors")) {
      entry x;
      x.name = e.at("name").get<std::string>();
      x.dtype = e.at("dtype").get<std::string>();
      for (const auto& d : e.at("shape")) {
        if (!d.is_number_integer())
          throw not_an_integer{"a dimension of 'shape' is not an integer"};
        x.shape.push_back(d.get<int64_t>());
      }
      x.offset = integer_at<uint64_t>(e, "offset");
      x.bytes = integer_at<uint64_t>(e, "bytes");
      if (!parse_hex64(e.at("hash").get<std::string>(), x.hash))
        return bad("tensor '" + x.name + "': hash is not 16 hex digits");
      if (!safetensors_scalar_type(x.dtype))
        return bad("tensor '" + x.name + "': unknown dtype '" + x.dtype + "'");
      uint64_t numel = 1;
      bool too_large = false;
      for (auto d : x.shape) {
        if (d < 0)
          return bad("tensor '" + x.name + "': negative dimension");
        too_large |= __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel);
      }
      uint64_t bytes = 0;
      too_large |= __builtin_mul_overflow(numel, safetensors_dtype_size(x.dtype), &bytes);
      if (too_large || bytes != x.bytes)
        return bad("tensor '" + x.name + "': " + std::to_string(x.bytes) +
                   " bytes do not match its shape and dtype");
      if (x.offset < end_of_previous || x.offset > t.payload_bytes ||
          x.bytes > t.payload_bytes - x.offset)
        return bad("tensor '" + x.name + "': bytes [" + std::to_string(x.offset) + ", " +
                   std::to_string(x.offset + x.bytes) +
                   ") overlap another tensor or lie outside the " +
                   std::to_string(t.payload_bytes) + "-byte payload");
      end_of_previous = x.offset + x.bytes;
      t.entries.push_back(std::move(x));
    }
  } catch (const json::exception& e) {
    return bad(std::string{"malformed ("} + e.what() + ")");
  } catch (const not_an_integer& e) {
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

expected<shm_contents> read_shm_segment(const uint8_t* base, uint64_t size, int64_t version,
                                        const std::string& where, const std::string& segment) {
  if (size < shm_header_bytes)
    return make_error(errc::corrupted, where + ": segment " + segment + " has " +
                                           std::to_string(size) +
                                           " bytes, less than its header (truncated)");
  const auto* h = reinterpret_cast<const shm_header*>(base);
  if (std::memcmp(h->magic, shm_magic, sizeof shm_magic) != 0)
    return make_error(errc::corrupted, where + ": segment " + segment + " has no troupe header");
  if (h->state.load(std::memory_order_acquire) != 1)
    return make_error(errc::corrupted, where + ": version " + std::to_string(h->version) +
                                           " in segment " + segment +
                                           " is partial (its publisher did not finish)");
  table t;
  t.version = h->version;
  if (auto err = check_version(t, version, where))
    return err;
  if (h->total_bytes > size)
    return make_error(errc::corrupted, where + ": version " + std::to_string(version) +
                                           " is truncated: " + std::to_string(size) + " bytes of " +
                                           std::to_string(h->total_bytes));
  if (h->data_offset < shm_header_bytes || h->data_offset > h->total_bytes ||
      h->data_bytes > h->total_bytes - h->data_offset || h->table_offset > h->total_bytes ||
      h->table_bytes > h->total_bytes - h->table_offset)
    return make_error(errc::corrupted, where + ": version " + std::to_string(version) +
                                           ": header ranges lie outside the segment");
  std::string_view text(reinterpret_cast<const char*>(base + h->table_offset), h->table_bytes);
  if (hash64(text.data(), text.size()) != h->table_hash)
    return make_error(errc::corrupted,
                      where + ": version " + std::to_string(version) + ": table checksum differs");
  auto decoded = decode_table(text, where);
  if (!decoded)
    return decoded.error();
  if (auto err = check_version(*decoded, version, where))
    return err;
  if (decoded->payload_bytes != h->data_bytes)
    return make_error(errc::corrupted, where + ": version " + std::to_string(version) +
                                           ": table and header disagree on the payload size");
  return shm_contents{std::move(*decoded), h->data_offset};
}

} // namespace troupe::runtime::transport_detail
