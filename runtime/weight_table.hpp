#pragma once
// The table every weight transfer carries (NOTE [versioned transfers] in
// weight_transport.hpp) and the header of a shm slot, with their codecs
// and checks: what a receiver reads from another process's file or
// segment before it trusts a byte of the payload. No LibTorch here (the
// fuzz target of the weight tables links this alone); the transports
// (transport_detail.hpp) make and verify the tensors.

#include "runtime/error.hpp"

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::runtime::transport_detail {

/// One tensor of a transfer's table.
struct entry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  uint64_t offset = 0; // within the payload
  uint64_t bytes = 0;
  uint64_t hash = 0;
};

/// The table every transfer carries.
struct table {
  int64_t version = -1;
  uint64_t payload_bytes = 0;
  std::vector<entry> entries;
};

/// The table as JSON text ("troupe-weights/1").
std::string encode_table(const table& t);
/// Parses and checks a table: known dtypes, sizes that match the shapes
/// (without overflow), ranges inside the payload, no overlaps
/// (errc::corrupted otherwise).
expected<table> decode_table(std::string_view text, const std::string& where);
/// version_mismatch unless the table holds `expected_version`.
caf::error check_version(const table& t, int64_t expected_version, const std::string& where);
/// A publisher's next version must be non-negative and above `last`.
caf::error check_new_version(int64_t version, int64_t last, const std::string& where);

/// The first page of a shm slot's segment: what the publisher wrote where.
struct shm_header {
  char magic[8];
  std::atomic<uint64_t> state; // 0 being written, 1 complete
  int64_t version;
  uint64_t total_bytes;
  uint64_t data_offset;
  uint64_t data_bytes;
  uint64_t table_offset;
  uint64_t table_bytes;
  uint64_t table_hash;
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);
inline constexpr uint64_t shm_header_bytes = 4096;
static_assert(sizeof(shm_header) <= shm_header_bytes);
inline constexpr char shm_magic[8] = {'T', 'R', 'P', 'W', 'S', 'H', 'M', '1'};

/// Reads the header and the table of a mapped segment of `size` bytes at
/// `base` (aligned to 8) that should hold `version`: a complete write, the
/// ranges inside the segment, the table's checksum, the table itself and
/// its agreement with the header. The payload is then at base +
/// data_offset, payload_bytes long (its hashes are checked by the caller).
struct shm_contents {
  table t;
  uint64_t data_offset = 0;
};
expected<shm_contents> read_shm_segment(const uint8_t* base, uint64_t size, int64_t version,
                                        const std::string& where, const std::string& segment);

} // namespace troupe::runtime::transport_detail
