#pragma once
// The collective calls this process is inside right now, for the driver's
// hang detection (NOTE [deadlocked collectives] in cluster/heartbeats.hpp).
//
// NOTE [calls in flight]: every blocking call of a process_group (a
// collective, a send or receive, a started transfer's wait, a split)
// registers {its group's identity, the rank, the group size, the op, the
// start time} in one process-wide table while it runs; a worker's heartbeat
// thread copies the oldest few into each datagram. A group's identity is
// equal on every rank of the group and differs between groups (a hash of
// the rendezvous name, a sub-group's of its parent's identity and its own
// name); a group of identity 0 (one built over a bare backend in a test)
// is not watched. A call that moves its data in pieces (process_group
// splits transfers into pieces of at most 64 MiB) notes its progress after
// each, and its age counts from the last: a long transfer that moves is
// not taken for a stuck one. The table costs a lock and two clock reads
// per call and per piece.

#include "runtime/enum_names.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace troupe::runtime {

enum class collective_op : uint8_t {
  all_reduce,
  broadcast,
  barrier,
  reduce,
  all_gather,
  reduce_scatter,
  scatter,
  gather,
  all_to_all,
  send,
  recv,
  wait,
  split
};
TROUPE_ENUM_NAMES(collective_op, "all_reduce", "broadcast", "barrier", "reduce", "all_gather",
                  "reduce_scatter", "scatter", "gather", "all_to_all", "send", "recv", "wait",
                  "split")

/// One call as the table reports it.
struct call_in_flight {
  uint64_t group = 0;
  int32_t rank = 0;
  int32_t size = 0;
  collective_op op = collective_op::all_reduce;
  /// How long it has run, by this process's clock.
  int64_t age_ms = 0;
  friend bool operator==(const call_in_flight&, const call_in_flight&) = default;
};

/// Registers a call for its lifetime (identity 0: nothing is registered).
class scoped_call {
public:
  scoped_call(uint64_t group, int rank, int size, collective_op op);
  ~scoped_call();
  scoped_call(const scoped_call&) = delete;
  scoped_call& operator=(const scoped_call&) = delete;

private:
  uint64_t slot_ = 0;
};

/// The calling thread's innermost registered call moved data: its age
/// counts from now.
void note_progress();

/// The calls in flight now, the longest-running first, at most `max`.
std::vector<call_in_flight> calls_in_flight(size_t max);

/// The identity of a group named `name` under `parent` (0 for a root
/// group: then `name` should say where it met, e.g. its store and key);
/// never 0.
uint64_t group_identity(uint64_t parent, std::string_view name);

} // namespace troupe::runtime
