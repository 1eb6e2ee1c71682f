#pragma once
// `troupe controller`: the daemon that owns jobs (docs/control.md). It takes
// specs, validates them fully before answering, queues them, starts each in
// a driver process of its own (`troupe driver`, so a crashing job never
// takes the controller down), talks to the job actor in it through CAF's
// middleman, and keeps every record in SQLite (job_store.hpp). The gRPC API
// (api_server.hpp) is a thin layer over this class.
//
// NOTE [controller states]: a job's state as the controller sees it is the
// job actor's (NOTE [job states] in actors/job/state.hpp) plus two of its
// own:
//
//   queued ──admitted──► pending ─► preparing ─► running ⇄ paused ─► succeeded
//     │                  (the driver process                          | failed
//     │ cancel            runs the job actor)                        | cancelled
//     ▼
//   cancelled            lost: the driver went away while the controller
//                        was down, without a final state
//
// A job waits `queued` until it is admitted: fewer than max_running_jobs
// run and its cores fit in what the running ones leave (first in, first
// out: a large job is not overtaken). A driver process that dies before its
// job reached a final state fails the job, with how it died.
//
// NOTE [controller restart]: drivers run in sessions of their own and do
// not die with the controller. A restarted controller reads its records;
// for each job that was not final it looks for the driver (the pid and port
// in <job dir>/driver.json, the pid still a `troupe driver` of that folder),
// re-attaches to it and subscribes to its events from the first (the job
// actor replays its journal); a job whose driver is gone takes the final
// state its journal ends with, or becomes `lost` — resumable when a
// checkpoint was written (ResumeJob queues it again with --resume).

#include "actors/job/job_actor.hpp"
#include "cluster/node_registry.hpp"
#include "runtime/enum_names.hpp"
#include "runtime/error.hpp"

#include <caf/fwd.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace troupe::cluster {

/// NOTE [controller states].
enum class ctl_state : uint8_t {
  queued,
  pending,
  preparing,
  running,
  paused,
  succeeded,
  failed,
  cancelled,
  lost
};
TROUPE_ENUM_NAMES(ctl_state, "queued", "pending", "preparing", "running", "paused", "succeeded",
                  "failed", "cancelled", "lost")
inline constexpr int ctl_state_count = static_cast<int>(enum_count<ctl_state>());

std::optional<ctl_state> parse_ctl_state(std::string_view s) noexcept;
ctl_state ctl_state_of(actors::job::job_state s) noexcept;
/// succeeded, failed, cancelled or lost.
bool is_final(ctl_state s) noexcept;

struct transition_view {
  ctl_state state = ctl_state::queued;
  int64_t time_us = 0;
  std::string reason;
};

/// Sums over a job's events (NOTE [job events]): what the exporters count.
struct job_totals {
  int64_t weight_syncs = 0;
  int64_t weight_sync_bytes = 0;
  double weight_sync_seconds = 0;
  int64_t checkpoints = 0;
  int64_t checkpoint_bytes = 0;
  /// Restarts begun, by role (NOTE [supervision]).
  actors::job::metric_map role_restarts;
};
template <class F>
void fields(F& f, job_totals& x) {
  f("weight_syncs", x.weight_syncs), f("weight_sync_bytes", x.weight_sync_bytes),
      f("weight_sync_seconds", x.weight_sync_seconds), f("checkpoints", x.checkpoints),
      f("checkpoint_bytes", x.checkpoint_bytes), f("role_restarts", x.role_restarts);
}
/// Adds one event to the sums.
void count(job_totals& t, const actors::job::event_body& b);

/// What GetJob answers.
struct job_view {
  ctl_state state = ctl_state::queued;
  /// The job actor's view (id, name, stage, iteration, phase, ETA, metrics,
  /// weight versions, error, last seq), as the events tell it.
  actors::job::job_status status;
  int64_t submit_time_us = 0;
  int64_t end_time_us = 0;
  std::string run_dir;
  int64_t driver_pid = 0;
  std::string exit_reason;
  int32_t queue_position = 0;
  bool resumable = false;
  std::vector<transition_view> transitions;
  /// Each role rank as its last `role` event left it.
  std::vector<actors::job::role_changed> roles;
  std::string resolved_config;
  std::vector<std::string> stages;
  job_totals totals;
  /// The nodes of its workers, by the plan's node index (NOTE [remote
  /// workers] in job_nodes.hpp); empty when they run on this machine.
  std::vector<std::string> nodes;
  /// Why a queued job waits, or a running one waits for a node to start a
  /// lost worker on (NOTE [replacing a worker] in job_nodes.hpp).
  std::string wait_reason;
};

struct submit_request {
  /// The job file's name and text, and the base files it names.
  std::string spec_name;
  std::string spec_text;
  std::vector<std::pair<std::string, std::string>> bases;
  std::vector<std::string> overrides;
  std::string name;
  /// Who asked (for the records).
  std::string submitter;
};

struct controller_limits {
  /// Bytes of a spec and of all its base files together.
  int64_t spec_bytes = 1 << 20;
  /// `--set` overrides per submit, and bytes of each.
  int64_t overrides = 256;
  int64_t override_bytes = 4096;
  /// Settings per UpdateJob.
  int64_t settings = 64;
};

/// What a controller's shutdown does with running jobs.
enum class shutdown_policy : uint8_t { checkpoint, drain, detach };
TROUPE_ENUM_NAMES(shutdown_policy, "checkpoint", "drain", "detach")

struct controller_options {
  /// Records (jobs.db), the token, and the jobs root (jobs/).
  std::string state_dir;
  /// The troupe executable started as each job's driver.
  std::string executable;
  int64_t max_running_jobs = 2;
  /// Cores to hand out (0 = this machine's).
  int64_t cores = 0;
  /// What shutdown does with running jobs: checkpoint (cancel them with a
  /// checkpoint; resumable), drain (wait for them to end) or detach (leave
  /// them running; a restarted controller re-attaches).
  shutdown_policy on_shutdown = shutdown_policy::checkpoint;
  /// Longest wait of a shutdown for its jobs.
  double shutdown_timeout_s = 300;
  /// Longest wait for a driver to publish its job actor.
  double driver_start_timeout_s = 60;
  /// Longest wait for the job actor's answer to a command.
  double command_timeout_s = 60;
  controller_limits limits;
  /// Node agents' heartbeats (NOTE [node membership]).
  node_options nodes;
  /// The address node agents' workers reach this machine's job drivers at
  /// (NOTE [remote workers]); "" = this host's name.
  std::string advertise;
};

/// One stream of a job's events for a watcher (WatchJob, TailLogs): the
/// events from a sequence number on, then live ones, then the end.
class event_cursor {
public:
  virtual ~event_cursor() = default;
  struct batch {
    std::vector<actors::job::event> events;
    /// Set once every event has been delivered and the job is final.
    std::optional<job_view> final;
  };
  /// The next events (at most `max`). Empty without `final`: none yet; the
  /// wake callback given at creation fires (on another thread) once there
  /// are more, or when the job ends.
  virtual batch next(size_t max) = 0;
};

class controller {
public:
  /// Opens the state directory (creating it, mode 0700), reads the records
  /// and re-attaches to running drivers (NOTE [controller restart]).
  static expected<std::unique_ptr<controller>> open(caf::actor_system& sys, controller_options o);
  ~controller();

  expected<job_view> submit(const submit_request& r);
  std::vector<job_view> list(const std::vector<ctl_state>& states, int64_t limit);
  expected<job_view> get(const std::string& id);

  using reply = std::function<void(expected<job_view>)>;
  /// Commands: the reply comes once the job actor (or, for a queued job,
  /// the controller) has taken them; from another thread.
  void cancel(const std::string& id, bool now, reply done);
  void pause(const std::string& id, reply done);
  void resume(const std::string& id, reply done);
  void checkpoint(const std::string& id, reply done);
  void update(const std::string& id, std::vector<std::pair<std::string, std::string>> settings,
              reply done);

  /// A cursor over the job's events from `from_seq`; `wake` is called when
  /// a cursor that had nothing has more.
  expected<std::unique_ptr<event_cursor>> watch(const std::string& id, int64_t from_seq,
                                                std::function<void()> wake);

  /// Stops admitting, then treats running jobs as options.on_shutdown says
  /// (bounded by shutdown_timeout_s). Idempotent.
  void shutdown();

  const controller_options& options() const;
  /// The records, for the API's audit log.
  class job_store& store();
  /// The node agents that joined (NodeService keeps it).
  node_registry& nodes();
  /// How many times the supervisor has looked at the jobs: once per piece
  /// of news or deadline (NOTE [supervision by events]), never on a timer.
  int64_t supervisor_rounds() const;

  struct impl;

private:
  controller() = default;
  std::shared_ptr<impl> impl_;
};

/// Hands every event of the job so far, from `from_seq` on, to `each` (from
/// memory, or from the journal of a final job) without waiting for more;
/// answers the sequence number after the last one handed.
expected<int64_t> each_event_so_far(controller& ctl, const std::string& id, int64_t from_seq,
                                    const std::function<void(const actors::job::event&)>& each);

/// What a job's driver process tells the controller, in <job dir>/driver.json:
/// its pid and the loopback port of its job actor.
struct driver_info {
  int64_t pid = 0;
  uint16_t port = 0;
};
inline constexpr const char* driver_info_file = "driver.json";
/// The driver's resolved job file in its job folder.
inline constexpr const char* driver_spec_file = "spec.yaml";
expected<void> write_driver_info(const std::string& job_dir, const driver_info& d);
expected<driver_info> read_driver_info(const std::string& job_dir);

} // namespace troupe::cluster
