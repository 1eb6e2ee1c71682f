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

#include "runtime/error.hpp"

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace troupe::cluster {

using register_atom = caf::atom_constant<caf::atom("register")>;
using worker_ping_atom = caf::atom_constant<caf::atom("wping")>;
using shutdown_atom = caf::atom_constant<caf::atom("shutdown")>;
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

struct launch_options {
  /// The troupe executable (cluster::self_executable()).
  std::string executable;
  /// One role name per worker; its size is the world size.
  std::vector<std::string> roles;
  /// Folder for each worker's output (worker-<rank>.log); empty = inherit.
  std::string log_dir;
  /// Bound on starting and registering all workers, and on each request.
  int64_t timeout_ms = 30000;
};

struct worker_info {
  int rank = 0;
  std::string role;
  int64_t pid = 0;
  caf::actor handle;
};

/// N local worker processes joined to this process's actor system (which
/// must have been configured with configure_network).
class local_workers {
public:
  local_workers();
  ~local_workers(); ///< Kills workers still running (SIGKILL) and reaps them.
  local_workers(local_workers&&) noexcept;
  local_workers& operator=(local_workers&&) noexcept;

  /// Starts and registers every worker, or fails naming the first that did
  /// not come up (and stops the others).
  static expected<local_workers> launch(caf::actor_system& sys, const launch_options& options);

  const std::vector<worker_info>& workers() const;

  /// The first failure so far, without blocking: a process that ended or a
  /// worker actor that went down. Empty error when all are healthy.
  caf::error check();

  /// Waits up to `timeout_ms` for a failure; returns it, or an empty error
  /// when none happened.
  caf::error wait_for_failure(int64_t timeout_ms);
  /// The signal that ended worker `rank`, waiting up to `timeout_ms` for it
  /// to be reaped; 0 when it runs or exited normally.
  int exit_signal(int rank, int64_t timeout_ms);

  /// Asks every worker to exit, waits up to `timeout_ms`, kills stragglers;
  /// fails naming any worker that did not exit cleanly.
  expected<void> shutdown(int64_t timeout_ms);

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace troupe::cluster
