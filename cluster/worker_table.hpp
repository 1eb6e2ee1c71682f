#pragma once
// The job workers a node agent started (NOTE [remote workers] in
// job_nodes.hpp): started, replaced, reaped and stopped here.

#include "cluster/job_nodes.hpp"
#include "cluster/local_launcher.hpp"

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace troupe::cluster {

/// Started from the agent's main thread only, which lives as long as the
/// agent: a worker dies with it (PR_SET_PDEATHSIG follows the thread). The
/// agent's writer thread reaps and stops alongside.
class worker_table {
public:
  /// `executable` runs `worker ...` (worker_argv); the workers' output goes
  /// to `work_dir`/jobs/<job>/worker-<rank>.log. A replaced worker still
  /// running gets `retire_grace_ms` to end before it is killed.
  worker_table(std::string executable, std::string work_dir, int64_t retire_grace_ms = 10000);
  ~worker_table();
  worker_table(const worker_table&) = delete;
  worker_table& operator=(const worker_table&) = delete;

  /// Starts a worker; on failure, the WorkerExited that says why (pid 0).
  /// One of the same job and rank that still runs is its replacement's to
  /// end first (NOTE [replacing a worker] in job_nodes.hpp).
  std::optional<worker_exit> start(const worker_start& s);

  /// Workers that ended (or were replaced) since the last call.
  std::vector<worker_exit> reap();

  /// Kills the workers of `job_id` ("" = all) and answers how each ended.
  std::vector<worker_exit> stop(const std::string& job_id, const std::string& reason);
  std::vector<worker_exit> stop_all(const std::string& reason) { return stop("", reason); }

private:
  struct running {
    worker_start start;
    local_process proc;
    std::string log;
  };

  std::optional<std::string> retire_previous(const worker_start& s);
  static worker_exit exit_of(const running& r, const exit_status& st);

  std::string exe_;
  std::string dir_;
  int64_t retire_grace_ms_;
  std::mutex mu_;
  std::vector<running> running_;
  /// Exits of replaced workers, for the next reap().
  std::vector<worker_exit> retired_;
};

} // namespace troupe::cluster
