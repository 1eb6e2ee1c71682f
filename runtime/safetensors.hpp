#pragma once
// safetensors reader and writer, written from the format specification:
//
//   [8 bytes]  N, the header length, unsigned 64-bit little-endian
//   [N bytes]  a UTF-8 JSON object, starting with '{', right-padded with
//              spaces: {"<name>": {"dtype": "F32", "shape": [2, 3],
//                                  "data_offsets": [begin, end]}, ...,
//                       "__metadata__": {"<key>": "<string value>"}}
//   [rest]     the data buffer; offsets are relative to its first byte and
//              the tensors cover it entirely, without holes or overlaps.
//
// Every reader validates the file against hostile input (bounded header,
// checked offsets and sizes, no read outside the file) and reports errors that
// name the file and what is wrong. Data is little-endian and row-major.

#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace troupe::runtime {

/// Named tensors, ordered by name.
using tensor_map = std::map<std::string, at::Tensor>;

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

/// Reads and validates the header only (the data is never read).
expected<safetensors_header> read_safetensors_header(const std::string& path);

/// Reads the "__metadata__" object (empty when the file has none).
expected<string_map> read_safetensors_metadata(const std::string& path);

/// Where a stored tensor may be read to: a contiguous CPU tensor to fill in
/// place, or an undefined tensor for a fresh one.
using tensor_target = std::function<at::Tensor(const std::string& name)>;

/// Loads every tensor into a contiguous CPU tensor of the stored dtype: the
/// one `target` names when its dtype and shape are the stored ones (read in
/// place, no second copy: a model loads straight into its parameters), else
/// a fresh one.
expected<tensor_map> load_safetensors(const std::string& path, const tensor_target& target = {});

/// Writes `tensors` (any device, any layout; copied to contiguous CPU one at
/// a time) and `metadata` to `path` atomically: temporary file, fsync, rename.
/// Header keys are sorted by name; data is ordered by element size
/// (descending) then name, so each tensor is aligned to its element size.
expected<void> save_safetensors(const std::string& path, const tensor_map& tensors,
                                const string_map& metadata = {});

} // namespace troupe::runtime
