#pragma once
// `troupe run CONFIG`, `troupe driver`, `troupe plan` and `troupe config show CONFIG`.

#include <string>
#include <vector>

namespace troupe::apps {

struct run_command_options {
  std::string config_path;
  std::vector<std::string> overrides; ///< --set a.b=value
  bool resume = false;
};

/// Loads, validates and runs a job; returns the exit status (0 done, 1 error,
/// 130 stopped by a signal with a checkpoint written).
int run_job_command(const run_command_options& options);

/// `troupe driver --job-dir DIR`: a controller's job (cluster/controller.hpp);
/// the exit status of run_job_command.
int driver_command(const std::string& job_dir, bool resume, bool on_nodes);

/// `troupe plan`: checks the placement and prints the plan; 0 = it fits.
int plan_command(const std::string& path, const std::vector<std::string>& overrides,
                 bool suggest = false);

/// Prints the resolved job config (defaults filled in, overrides applied).
int config_show_command(const std::string& path, const std::vector<std::string>& overrides,
                        bool comments);

} // namespace troupe::apps
