#pragma once
// Roles hosted in worker processes: the role host `troupe run` uses when
// the job's placement names pools of devices (NOTE [role hosting] in
// actors/rl/roles.hpp, NOTE [placement modes] in actors/rl/job_config.hpp).
// One worker process per device of the plan; each role rank is built in
// the worker of its device and reached through a role proxy (NOTE [role
// proxy] in actors/role_proxy.hpp), so a worker that dies fails the
// driver's open requests at once, naming the role and the worker.

#include "actors/rl/job.hpp"
#include "actors/rl/placement.hpp"
#include "actors/rl/roles.hpp"
#include "cluster/workers.hpp"

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace troupe::cluster {

class worker_host final : public actors::rl::role_host {
public:
  /// Starts one worker per device of `plan` (labelled with its pool and
  /// roles) using `options`' executable, log folder and timeout; on the
  /// nodes of options.remote when it is set (its node_of is filled in from
  /// the plan).
  static expected<std::unique_ptr<worker_host>> launch(caf::actor_system& sys,
                                                       const actors::rl::placement_plan& plan,
                                                       launch_options options);

  expected<std::vector<caf::actor>> spawn(caf::actor_system& sys,
                                          const actors::rl::role_spec& spec) override;
  std::string store_host() const override;
  std::string address_of(const std::string& role, int rank) const override;
  place where(const std::string& role, int rank) const override;
  int exit_signal(const std::string& role, int rank, int64_t timeout_ms) override;
  expected<void> revive(const actors::rl::role_spec& spec) override;
  std::string loss_detail(const std::string& role, int rank) const override;
  bool stale(const std::string& role) const override;
  /// The first failure of a worker so far (see worker_set::check).
  caf::error check();

  /// Stops the workers (see worker_set::shutdown).
  expected<void> shutdown(int64_t timeout_ms);
  const std::vector<worker_info>& workers() const { return workers_.workers(); }

private:
  worker_host() = default;
  worker_set workers_;
  std::string store_host_ = "127.0.0.1";
  actors::rl::placement_plan plan_;
  int64_t timeout_ms_ = 30000;
  std::vector<std::shared_ptr<void>> stores_;
  /// The worker generation each role's ranks were built on, by device
  /// (NOTE [supervision]: a role lost with a worker already started again
  /// is rebuilt at once).
  std::map<std::string, std::map<int64_t, int>> built_on_;
};

/// Runs a job where its placement says: in this process (in_process), or
/// with worker processes launched for it (executable, log folder and
/// timeout from `options`; logs default to <run dir>/workers; on nodes when
/// options.remote is set) and stopped afterwards. A job that fails because
/// a worker died says how it died.
/// `sys` must be configured with configure_network when workers are used.
expected<actors::rl::job_summary> run_placed_job(caf::actor_system& sys,
                                                 const actors::rl::job_config& cfg,
                                                 actors::rl::run_options opts,
                                                 launch_options options);

} // namespace troupe::cluster
