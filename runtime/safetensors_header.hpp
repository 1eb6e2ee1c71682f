#pragma once
// The safetensors header, parsed from bytes (no LibTorch here): the dtypes,
// the bounded length field and the JSON header checked against the data it
// describes. runtime/safetensors.hpp reads and writes files with it; the
// fuzz target and `troupe plan` use it as is. The format is described at
// the top of safetensors.hpp.

#include "runtime/error.hpp"

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::runtime {

/// String key/value pairs of a safetensors "__metadata__" object.
using string_map = std::map<std::string, std::string>;

/// Largest header a reader accepts (the reference implementation's bound).
inline constexpr uint64_t safetensors_max_header_bytes = 100'000'000;

/// One tensor entry of a safetensors header.
struct tensor_info {
  std::string name;
  /// The dtype as written in the file ("F32", "BF16", ...).
  std::string dtype;
  std::vector<int64_t> shape;
  /// Byte range [data_begin, data_end) relative to the start of the data.
  uint64_t data_begin = 0;
  uint64_t data_end = 0;
};

/// A validated safetensors header.
struct safetensors_header {
  /// Tensors in file order (ascending data_begin).
  std::vector<tensor_info> tensors;
  string_map metadata;
  /// Absolute file offset of the data buffer (8 + header length).
  uint64_t data_start = 0;
};

/// Size in bytes of one element of a safetensors dtype ("F32" -> 4), or 0
/// for an unknown dtype name.
uint64_t safetensors_dtype_size(const std::string& dtype);

/// Whether this build loads and saves tensors of the given safetensors dtype.
bool safetensors_dtype_supported(const std::string& dtype);

/// The safetensors dtype name of `type` ("F32"), or "" when it has none.
std::string safetensors_dtype_name(at::ScalarType type);

/// The scalar type of a safetensors dtype name this build loads, or nullopt.
std::optional<at::ScalarType> safetensors_scalar_type(const std::string& dtype);

/// The dtypes this build loads, as a list for errors ("F64, F32, ...").
std::string safetensors_supported_dtypes();

/// Checks the header length `n` a file of `file_size` bytes declares: at
/// most safetensors_max_header_bytes, and inside the file.
expected<void> check_safetensors_header_length(uint64_t n, uint64_t file_size,
                                               const std::string& path);

/// Parses and validates header JSON `text` against the `data_size` bytes of
/// data that follow it: every entry well-formed, no key twice, the tensors
/// covering the data exactly. Sets data_start to 8 + text.size().
expected<safetensors_header> parse_safetensors_header(const std::string& text, uint64_t data_size,
                                                      const std::string& path);

/// Parses the header of a whole safetensors file held in memory (`file`),
/// as read_safetensors_header does a file on disk.
expected<safetensors_header> parse_safetensors_bytes(std::string_view file,
                                                     const std::string& path);

/// A sharded checkpoint's index (model.safetensors.index.json): which
/// shard file holds each tensor, and the tensors of each shard.
struct safetensors_index {
  std::map<std::string, std::string> shard_of;
  std::map<std::string, std::set<std::string>> listed;
};

/// Parses an index's JSON `text`: "weight_map" an object of tensor name to
/// shard file name, each a plain file name (no directory part), and
/// "metadata" absent, null or an object. Errors name `index_path`.
expected<safetensors_index> parse_safetensors_index(const std::string& text,
                                                    const std::string& index_path);

} // namespace troupe::runtime
