#pragma once
// The controller's decisions as plain classes (NOTE [controller core]):
// which state moves a job may make, which queued job starts next and where,
// and what becomes of a job found unfinished when the controller starts.
// No threads, no clocks, no processes here: the caller passes time and
// process facts in, so each rule is unit-tested with made-up facts.
//
// NOTE [controller core]: the controller (controller.cpp) owns the jobs,
// their records, drivers and feeds under one mutex and a supervising
// thread; what it decides it asks these classes:
//   ctl_transitions  the legal edges between ctl_states; an event that
//                    would take a job along another edge, or one older than
//                    the job's last transition (a journal replayed after a
//                    restart), moves nothing;
//   admission        the queue (first in, first out: nothing overtakes the
//                    head), the limits (running jobs, the controller
//                    machine's cores) and node placement, with the reason
//                    the head waits;
//   recovery         a restarted controller's verdict per job record, from
//                    its state and what its driver.json and process say.

#include "actors/rl/job_choices.hpp"
#include "cluster/controller.hpp"
#include "cluster/node_registry.hpp"

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <vector>

namespace troupe::cluster {

// ---- transitions ----------------------------------------------------------

/// Whether a job may move from `from` to `to` (a same-state move is not a
/// move). Final states end the job, except that failed, cancelled and lost
/// jobs may be queued again (resume).
bool transition_allowed(ctl_state from, ctl_state to) noexcept;

/// One job's state and its history of moves.
class job_book {
public:
  explicit job_book(ctl_state initial = ctl_state::queued) : state_(initial) {}
  ctl_state state() const noexcept { return state_; }
  const std::vector<transition_view>& transitions() const noexcept { return transitions_; }
  /// Restores a recorded history (a controller restart); the state is the
  /// record's.
  void restore(ctl_state state, std::vector<transition_view> history);
  /// Moves to `to` at `time_us`; false (nothing changes) when it is the
  /// state already, not an edge, or older than the last move (a replayed
  /// event).
  bool move(ctl_state to, int64_t time_us, std::string reason);

private:
  ctl_state state_;
  std::vector<transition_view> transitions_;
};

// ---- admission ------------------------------------------------------------

/// What admission needs to know about a queued job.
struct admission_request {
  std::string id;
  /// Cores its processes take on the controller's machine.
  int64_t cores = 1;
  /// Devices per node of its plan; empty when its roles run in its driver.
  std::vector<int64_t> node_need;
  actors::rl::launcher_kind launcher = actors::rl::launcher_kind::automatic;
};

/// A job whose driver runs: what it holds.
struct running_job {
  /// Cores on the controller's machine (1, its driver, when on nodes).
  int64_t cores = 1;
  /// The nodes its workers run on and the devices on each.
  std::vector<std::string> nodes;
  std::vector<int64_t> node_need;
};

/// The decision for the head of the queue.
struct admission_decision {
  bool start = false;
  /// Its workers run on nodes: these, by plan node index.
  bool on_nodes = false;
  std::vector<std::string> nodes;
  /// Cores it holds on the controller's machine once started.
  int64_t cores = 1;
  /// Why it waits ("" when it starts).
  std::string wait_reason;
};

class admission {
public:
  admission() = default;
  admission(int64_t cores_total, int64_t max_running) { limit(cores_total, max_running); }
  /// The controller machine's cores and the most jobs that run at once.
  void limit(int64_t cores_total, int64_t max_running) {
    cores_total_ = cores_total < 1 ? 1 : cores_total;
    max_running_ = max_running;
  }

  void enqueue(const std::string& id) { queue_.push_back(id); }
  /// Takes `id` out of the queue (cancelled, or started).
  void remove(const std::string& id);
  /// 1-based place in the queue; 0 when not queued.
  int64_t position(const std::string& id) const;
  const std::deque<std::string>& queue() const noexcept { return queue_; }
  int64_t cores_total() const noexcept { return cores_total_; }

  /// Whether the head may start now, given the jobs that run and the
  /// nodes; `running.size()` counts against the limit on running jobs.
  admission_decision decide(const admission_request& head, const std::vector<running_job>& running,
                            const std::vector<node_view>& nodes) const;

private:
  int64_t cores_total_ = 1;
  int64_t max_running_ = 1;
  std::deque<std::string> queue_;
};

// ---- recovery -------------------------------------------------------------

enum class recovery_step : uint8_t {
  /// Final already: nothing to do.
  keep,
  /// Queued: back in the queue, in record order.
  requeue,
  /// Its driver still runs: attach to its job actor again.
  reattach,
  /// Its driver is gone: read the journal's rest, then lost unless final.
  settle
};
TROUPE_ENUM_NAMES(recovery_step, "keep", "requeue", "reattach", "settle")

/// What a restarted controller does with a job record in `state` whose
/// driver was `recorded_pid`: `info` is its driver.json (nullopt when
/// missing or unreadable) and `running` whether that pid is a live
/// `troupe driver` of this job's folder (pids are reused).
recovery_step plan_recovery(ctl_state state, int64_t recorded_pid, const std::optional<driver_info>& info,
                            bool running);

} // namespace troupe::cluster
