#pragma once
// What a Slurm allocation offers a job (docs/cluster.md, "On Slurm"):
// `troupe slurm run` reads the allocation from the SLURM_* variables that
// sbatch / salloc set, starts a controller on the batch host and one node
// agent per allocated node with srun, runs the job and ends with its result.

#include "runtime/error.hpp"

#include <functional>
#include <string>
#include <vector>

namespace troupe::cluster {

/// "node[01-03,7],gpu-a" → node01, node02, node03, node7, gpu-a (Slurm's
/// host list syntax: comma-separated names, each with at most one bracket
/// of numbers and ranges, zero-padded as written). Errors quote the list.
expected<std::vector<std::string>> expand_hostlist(const std::string& list);

/// "2(x3),1" → 2, 2, 2, 1 (SLURM_JOB_CPUS_PER_NODE).
expected<std::vector<int>> expand_counts(const std::string& list);

struct slurm_allocation {
  std::string job_id;
  /// The allocated nodes, in Slurm's order; the first runs the batch script.
  std::vector<std::string> nodes;
  /// CPUs of each node of the allocation.
  std::vector<int> cpus;
  /// The directory sbatch was called from (shared by the nodes).
  std::string submit_dir;
};

/// The allocation this process runs in, from the environment (`env` looks a
/// variable up; nullptr when unset). Outside an allocation: an error saying
/// so.
expected<slurm_allocation> read_allocation(const std::function<const char*(const char*)>& env);

} // namespace troupe::cluster
