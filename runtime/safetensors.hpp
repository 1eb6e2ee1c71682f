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
#include "runtime/safetensors_header.hpp"

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
