#pragma once
// Jobs run with their roles in real `troupe worker` processes (the test's
// temporary folder holds the workers' logs).
#include "actors/rl/job.hpp"
#include "cluster/role_host.hpp"
#include "tests/cluster/networked_system.hpp"
#include "tests/support/temp_dir.hpp"

#include <utility>

namespace troupe::test {

inline cluster::launch_options launcher(const temp_dir& tmp) {
  cluster::launch_options o;
  o.executable = TROUPE_BINARY_PATH;
  o.log_dir = tmp.file("logs");
  o.timeout_ms = 30000;
  return o;
}

inline expected<actors::rl::job_summary> run_placed(const actors::rl::job_config& cfg,
                                                    const temp_dir& tmp,
                                                    actors::rl::run_options opts = {}) {
  networked_system ns;
  return cluster::run_placed_job(*ns.sys, cfg, std::move(opts), launcher(tmp));
}

} // namespace troupe::test
