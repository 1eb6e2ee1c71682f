#pragma once
// NOTE [shm all-reduce]: the ranks of a group on one host summing through
// shared memory instead of sockets. A tensor-parallel decode step runs a
// few small collectives per layer (NOTE [tensor-parallel decode] in
// models/llama.cpp), and over gloo each is a round through TCP and I/O
// threads (about a millisecond on a loaded 2-vCPU host), far more than the
// work between them. Here each rank writes its tensor into its own slot of
// a shared segment, publishes the call's sequence number in its flag (its
// own cache line), spins (then yields) until every rank's flag has reached
// it, and reads: all_reduce sums the slots in rank order — the same
// additions in the same order on every rank, so every rank holds the same
// bits — and all_gather copies them out. The slots alternate between two
// buffers by the call's parity: a rank can start call k + 2 only after
// every rank has started call k + 1, that is, finished reading call k, so
// no slot is overwritten while read. Float32 sums and all-gathers up to
// the slot size go this way; every other call, and larger ones, go to the
// wrapped group. The segment is created by rank 0, named through the
// rendezvous store, and unlinked once every rank has mapped it (a crashed
// rank leaves nothing behind).

#include "runtime/collectives.hpp"

#include <algorithm>
#include <cstdint>
#include <string>

namespace troupe::runtime {

/// A cache line: the unit the shared segments below align flags and slots to.
inline constexpr int64_t shm_line_bytes = 64;

/// `group` (every rank on this host) with all-reduces (sum, float32) and
/// flat all-gathers up to `slot_bytes` a rank through shared memory (NOTE
/// [shm all-reduce]). Every rank calls it at once, with the same `name`
/// (unique on `rendezvous`); the group's timeout bounds each wait.
expected<process_group> with_shm_collectives(process_group group, store& rendezvous,
                                             const std::string& name, int64_t slot_bytes = 1 << 20,
                                             int64_t timeout_ms = 30000);

/// Bytes of the shared segment such a group of `ranks` maps (each rank's
/// flag line and two slots: the calls alternate between them).
inline int64_t shm_collectives_bytes(int ranks, int64_t slot_bytes) {
  return ranks * shm_line_bytes + 2 * ranks * slot_bytes;
}

/// NOTE [shm point-to-point]: `group` (every rank on this host) with its
/// sends and receives of up to `slot_bytes` through shared memory, for a
/// pipeline's hand-offs, which are on the 1F1B critical path: over gloo
/// each goes through a socket and an I/O thread (a 128 KB round trip 165
/// us here, 44 us this way: bench/bench_strategies --pipeline). Each ordered pair of neighbouring
/// ranks (r, r ± 1: a pipeline's stages) has a mailbox of `slots` slots, each a header line (the
/// sender's sequence number, 0 when free; the tag; the bytes) and its payload. A send copies the
/// tensor into a free slot of its mailbox and publishes it (it waits only while every slot is full:
/// give more slots than messages a pair has in flight); a receive takes the matching tag's oldest
/// message, copies it out and frees the slot, spinning, then yielding, then sleeping briefly while
/// it waits. Larger tensors, other pairs and every collective go to the wrapped group; both ends
/// pick the path by the pair and the tensor's size, which they agree on. Set up as
/// with_shm_collectives (rank 0 creates and names the segment, every rank
/// maps it, the name is unlinked).
expected<process_group> with_shm_point_to_point(process_group group, store& rendezvous,
                                                const std::string& name,
                                                int64_t slot_bytes = 1 << 20, int slots = 4,
                                                int64_t timeout_ms = 30000);

/// Bytes of the segment such a group of `ranks` maps.
inline int64_t shm_point_to_point_bytes(int ranks, int64_t slot_bytes, int slots) {
  return std::max<int64_t>(2 * (ranks - 1), 0) * slots * (shm_line_bytes + slot_bytes);
}

} // namespace troupe::runtime
