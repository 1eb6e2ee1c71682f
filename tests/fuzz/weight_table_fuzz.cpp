// Fuzz target: the weight-transport tables (runtime/weight_table.hpp) —
// the manifest of a disk or broadcast transfer and a shm slot's segment,
// which a receiver reads from another process before trusting a byte of
// the payload. The first byte picks the reader: even the JSON table, odd a
// whole shm segment (header page, table and payload) that should hold
// version 1; with bit 1 set too, the target writes the table's checksum
// into the header first (as a publisher does), so that mutations reach the
// table's parser past the checksum. An accepted table's tensors lie inside the payload in order,
// each the size its shape and dtype say, and the table encodes to text
// that decodes to the same table.
#include "runtime/hash.hpp"
#include "runtime/safetensors_header.hpp"
#include "runtime/weight_table.hpp"
#include "tests/fuzz/fuzz_input.hpp"

#include <cstdint>
#include <cstring>
#include <vector>

using namespace troupe::runtime;
using namespace troupe::runtime::transport_detail;

namespace {

void check_table(const table& t) {
  uint64_t end = 0;
  for (const auto& e : t.entries) {
    if (e.offset < end || e.offset > t.payload_bytes || e.bytes > t.payload_bytes - e.offset)
      troupe::fuzz::broken();
    unsigned __int128 n = safetensors_dtype_size(e.dtype);
    for (auto d : e.shape)
      n *= static_cast<uint64_t>(d);
    if (n != e.bytes)
      troupe::fuzz::broken();
    end = e.offset + e.bytes;
  }
  const auto text = encode_table(t);
  auto back = decode_table(text, "re-encoded table");
  if (!back || encode_table(*back) != text)
    troupe::fuzz::broken();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  if (data[0] % 2 == 0) {
    auto t = decode_table(troupe::fuzz::text_of(data + 1, size - 1), "manifest.json");
    if (t)
      check_table(*t);
    return 0;
  }
  // A segment is mapped page-aligned: copy to aligned memory of its size.
  std::vector<uint64_t> segment((size - 1 + 7) / 8);
  if (size > 1)
    std::memcpy(segment.data(), data + 1, size - 1);
  auto* base = reinterpret_cast<uint8_t*>(segment.data());
  if ((data[0] & 2) != 0 && size - 1 >= sizeof(shm_header)) {
    auto* h = reinterpret_cast<shm_header*>(base);
    if (h->table_offset <= size - 1 && h->table_bytes <= size - 1 - h->table_offset)
      h->table_hash = hash64(base + h->table_offset, h->table_bytes);
  }
  auto read = read_shm_segment(base, size - 1, 1, "shm channel 'fuzz'", "/troupe-fuzz");
  if (read) {
    if (read->data_offset + read->t.payload_bytes > size - 1)
      troupe::fuzz::broken();
    check_table(read->t);
  }
  return 0;
}
