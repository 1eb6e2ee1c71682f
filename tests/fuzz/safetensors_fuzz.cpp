// Fuzz target: the safetensors header and a sharded checkpoint's index
// (runtime/safetensors_header.hpp), parsed from bytes as the loader reads
// them from a downloaded checkpoint. The first byte picks the parser: even
// a whole .safetensors file, odd a model.safetensors.index.json. Parsing
// succeeds or answers an error; an accepted header's tensors lie inside
// the file, in order, without overlap, each the size its shape and dtype
// say.
#include "runtime/safetensors_header.hpp"
#include "tests/fuzz/fuzz_input.hpp"

#include <cstdint>

using namespace troupe;

namespace {

void check_header(const runtime::safetensors_header& h, size_t file_size) {
  uint64_t end = 0;
  for (const auto& t : h.tensors) {
    if (t.data_begin != end || t.data_end < t.data_begin || h.data_start + t.data_end > file_size)
      fuzz::broken();
    uint64_t n = runtime::safetensors_dtype_size(t.dtype);
    for (auto d : t.shape)
      n *= static_cast<uint64_t>(d);
    if (n != t.data_end - t.data_begin)
      fuzz::broken();
    end = t.data_end;
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  const auto rest = fuzz::text_of(data + 1, size - 1);
  if (data[0] % 2 == 0) {
    auto h = runtime::parse_safetensors_bytes(rest, "model.safetensors");
    if (h)
      check_header(*h, rest.size());
  } else {
    auto index =
        runtime::parse_safetensors_index(std::string{rest}, "model.safetensors.index.json");
    if (index)
      for (const auto& [name, file] : index->shard_of)
        if (file.find('/') != std::string::npos || file == ".." || !index->listed.count(file))
          fuzz::broken();
  }
  return 0;
}
