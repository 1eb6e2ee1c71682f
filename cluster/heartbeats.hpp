#pragma once
// NOTE [heartbeats]: a worker process tells its driver that it runs by a
// UDP datagram (its rank and pid) eight times each heartbeat interval,
// sent by a thread of its own; the driver's watchdog (workers.cpp) drains
// them and kills a worker silent for 2 intervals as hung (stopped,
// swapping) — found within 3 intervals. Datagrams, not CAF messages: a
// worker's connection to the driver carries its replies too, and a large
// one (a trainer's state, hundreds of MB, as a checkpoint gathers it)
// holds a ping's answer behind it for seconds, which a busy worker must
// not be killed for. They travel on the job's data plane (docs/cluster.md:
// a trusted network); a datagram that is not one is ignored.
//
// NOTE [deadlocked collectives]: a rank stuck in a collective still sends
// heartbeats (its thread is not the one stuck), so each datagram also
// carries the oldest collective calls the worker is inside (NOTE [calls in
// flight] in runtime/inflight.hpp: group identity, rank, group size, op,
// age by the worker's own clock — the clocks need not agree). A group is
// deadlocked when every one of its ranks reports a call of it that has run
// for 2 intervals: the last rank to arrive has waited that long too, so
// all are inside it and none moves (a rank waiting for a peer that still
// computes is not: the peer is not in the call). The watchdog kills the
// group's workers as hung, found within 3 intervals of the last arrival.
// A transfer that moves is not stuck: process_group moves large tensors in
// pieces and a call's age counts from its last piece's end. A group of one
// rank waits for no one. Not covered: ranks stuck in calls of different
// groups that wait on each other, a rank that skipped the call and idles,
// and a single piece (64 MiB at most) that takes 2 intervals.

#include "runtime/error.hpp"
#include "runtime/inflight.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe::cluster {

struct heartbeat {
  int32_t rank = 0;
  int64_t pid = 0;
  /// NOTE [deadlocked collectives]: at most max_calls, the oldest first.
  std::vector<runtime::call_in_flight> calls;
  static constexpr size_t max_calls = 8;
};

/// A heartbeat as sent (calls past max_calls are left out), and read back
/// (nullopt: not a heartbeat). The 16-byte form without calls is read too.
std::string encode_heartbeat(const heartbeat& h);
std::optional<heartbeat> decode_heartbeat(const char* data, size_t size);

/// The calls one worker reported last.
struct worker_calls {
  int worker = 0;
  std::vector<runtime::call_in_flight> calls;
};

/// A deadlocked group: each of its ranks in one of its calls for at least
/// the threshold, and which workers hold them.
struct deadlock {
  uint64_t group = 0;
  /// Per rank of the group: the worker, its call's op and age.
  struct member {
    int worker = 0;
    runtime::collective_op op{};
    int64_t age_ms = 0;
  };
  std::vector<member> ranks;
  /// The youngest call's age: how long the group has been stuck.
  int64_t stuck_ms() const;
  /// "every rank of collective group <hex> (2 ranks) has been inside it
  /// for >= N ms: rank 0 in all_reduce on worker 1, ..."
  std::string describe() const;
};

/// NOTE [deadlocked collectives]: the groups every rank of which reports a
/// call of the group at least `min_age_ms` old, by identity.
std::vector<deadlock> find_deadlocks(const std::vector<worker_calls>& workers, int64_t min_age_ms);

/// The driver's end: a UDP socket on `host` (an IP address), port chosen.
class heartbeat_receiver {
public:
  static expected<heartbeat_receiver> open(const std::string& host);
  heartbeat_receiver() = default;
  heartbeat_receiver(heartbeat_receiver&& o) noexcept;
  heartbeat_receiver& operator=(heartbeat_receiver&& o) noexcept;
  heartbeat_receiver(const heartbeat_receiver&) = delete;
  heartbeat_receiver& operator=(const heartbeat_receiver&) = delete;
  ~heartbeat_receiver();

  uint16_t port() const { return port_; }
  /// The heartbeats that arrived since the last call, without waiting.
  std::vector<heartbeat> drain();

private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

/// The worker's end: a detached thread that sends `h` to host:port every
/// `every` for the rest of the process's life, each with the calls in
/// flight at the time (NOTE [deadlocked collectives]).
expected<void> start_heartbeats(const std::string& host, uint16_t port, heartbeat h,
                                std::chrono::milliseconds every);

} // namespace troupe::cluster
