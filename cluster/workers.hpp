#pragma once
// Worker processes: `troupe worker` hosts rank actors; a local launcher
// starts N of them (like torchrun --nproc_per_node), joins them to the
// driver through CAF's middleman and watches them.
//
// NOTE [worker lifecycle]: the driver publishes a registrar actor on an
// ephemeral loopback port and starts each worker with its address, rank,
// world size and role. A worker connects, registers (rank, pid, its own
// actor) and monitors the registrar. The driver monitors every worker actor
// and polls the processes, so a worker that exits, is killed or loses its
// connection fails the job with an error naming its rank, role, pid and
// exit status or signal. Workers exit when the driver goes away: the
// registrar's down message for a remote driver, PR_SET_PDEATHSIG for a
// local parent. No orphans.

#include "cluster/job_nodes.hpp"
#include "runtime/error.hpp"

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <functional>
#include <string>
#include <vector>

namespace troupe::cluster {

using register_atom = caf::atom_constant<caf::atom("register")>;
using worker_ping_atom = caf::atom_constant<caf::atom("wping")>;
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;
/// Driver → worker on a node: you are hung (NOTE [deadlocked collectives]);
/// the worker ends itself by SIGKILL.
using worker_hung_atom = caf::atom_constant<caf::atom("whung")>;
/// Driver → worker: build a role (actors::rl::role_spec) here; answers its actor.
using spawn_role_atom = caf::atom_constant<caf::atom("spawnrole")>;

/// Exit status of a worker whose driver went away.
inline constexpr int worker_exit_driver_lost = 3;

struct worker_options {
  std::string driver_host = "127.0.0.1";
  uint16_t driver_port = 0;
  int rank = 0;
  int world = 1;
  std::string role = "worker";
  int64_t timeout_ms = 30000;
};

/// The process side (`troupe worker`): connects, registers, serves until
/// told to shut down (0) or until the driver goes away
/// (worker_exit_driver_lost). Errors go to stderr; returns the exit code
/// when it could not start, and otherwise ends the process with it.
int run_worker(const worker_options& options);

/// Loads CAF's middleman and sets its heartbeat so a silent peer is noticed
/// within a few seconds. Call on the config before creating the system.
void configure_network(caf::actor_system_config& cfg);

/// Workers on node agents (NOTE [remote workers] in job_nodes.hpp).
struct remote_launch {
  /// The address the registrar listens on (reached from every node).
  std::string bind_host;
  /// Name and address of each node of the job.
  std::vector<job_node> nodes;
  /// The node (index into `nodes`) of each worker.
  std::vector<int64_t> node_of;
  /// Tells the controller which workers to start (NOTE [driver link]).
  std::function<void(const worker_request_file&)> ask_for_workers;
  /// Per worker: whether every role it hosts may be restarted (unset:
  /// none may).
  std::vector<bool> restartable;
  /// NOTE [replacing a worker]: asks the controller for a lost worker
  /// again and waits for the node it was started on (unset: a lost
  /// worker on a node is not restarted).
  std::function<expected<job_node>(const worker_entry&)> replace_worker;
};

struct launch_options {
  /// The troupe executable (cluster::self_executable()).
  std::string executable;
  /// One role name per worker; its size is the world size.
  std::vector<std::string> roles;
  /// Folder for each worker's output (worker-<rank>.log); empty = inherit.
  std::string log_dir;
  /// Bound on starting and registering all workers, and on each request.
  int64_t timeout_ms = 30000;
  /// NOTE [heartbeats]: the heartbeat interval (supervision.heartbeat_s);
  /// a worker silent for 2 of them is killed as hung, and so are the
  /// workers of a collective deadlocked for 2 (NOTE [deadlocked
  /// collectives]). 0 = no heartbeats.
  int64_t heartbeat_ms = 0;
  /// Set: the workers run on nodes, started by their agents; unset: they
  /// are this process's children.
  std::optional<remote_launch> remote;
};

struct worker_info {
  int rank = 0;
  std::string role;
  int64_t pid = 0;
  caf::actor handle;
  /// The node it runs on ("" = this machine) and the node's address.
  std::string node;
  std::string host = "127.0.0.1";
};

/// N worker processes joined to this process's actor system (which must
/// have been configured with configure_network): local children, or
/// processes the controller's node agents start (NOTE [remote workers]).
class worker_set {
public:
  worker_set();
  ~worker_set(); ///< Kills local workers still running (SIGKILL) and reaps them.
  worker_set(worker_set&&) noexcept;
  worker_set& operator=(worker_set&&) noexcept;

  /// Starts (or asks for) and registers every worker, or fails naming the
  /// first that did not come up (and stops the others).
  static expected<worker_set> launch(caf::actor_system& sys, const launch_options& options);

  const std::vector<worker_info>& workers() const;

  /// The first failure so far, without blocking: a process that ended or a
  /// worker actor that went down. Empty error when all are healthy.
  caf::error check();

  /// Waits up to `timeout_ms` for a failure; returns it, or an empty error
  /// when none happened.
  caf::error wait_for_failure(int64_t timeout_ms);
  /// NOTE [supervision]: starts worker `rank` again when its process ended
  /// or lost its connection (then killed first), and waits for it to
  /// register; a worker that runs connected is kept. A worker on a node
  /// is asked of the controller again (NOTE [replacing a worker] in
  /// job_nodes.hpp), on its node or another.
  expected<void> revive(int rank);
  /// Why the watchdog killed worker `rank` ("" when it did not: NOTE
  /// [heartbeats]).
  std::string hung(int rank) const;
  /// How often worker `rank` was started again (0: never).
  int generation(int rank) const;
  /// The signal that ended worker `rank`, waiting up to `timeout_ms` for it
  /// to be reaped; 0 when it runs, exited normally or is remote.
  /// With `generation` (see generation()): the signal that ended that
  /// process of the worker, once it was started again.
  int exit_signal(int rank, int64_t timeout_ms, int generation = -1);

  /// Asks every worker to exit, waits up to `timeout_ms`, kills stragglers
  /// (remote ones: waits for their connections to close; their agents end
  /// the rest); fails naming any worker that did not exit cleanly.
  expected<void> shutdown(int64_t timeout_ms);

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace troupe::cluster
