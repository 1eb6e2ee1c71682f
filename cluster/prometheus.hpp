#pragma once
// What the controller exports about its jobs to the tools people already
// run: Prometheus' text exposition format (docs/dashboard.md lists the
// metrics), and the jobs' processes on this machine (the dashboard's
// placement map, troupe_process_resident_memory_bytes).

#include "cluster/controller.hpp"

#include <string>
#include <vector>

namespace troupe::cluster {

struct process_info {
  /// The machine: this one's host name, or the node a worker runs on
  /// (whose memory is not read from here: rss_bytes 0).
  std::string node;
  /// "driver" or the worker's name, as role events name it.
  std::string process;
  int64_t pid = 0;
  bool alive = false;
  int64_t rss_bytes = 0;
};

/// The job's processes on this machine — its driver and the processes its
/// role ranks run in — with their resident memory from /proc.
std::vector<process_info> processes_of(const job_view& v);

/// The exposition (text format 0.0.4) of `jobs`: jobs by state, and for
/// each job that is not final its step, score, KL, throughput, phase
/// seconds, rollout speed and KV use, weight-sync and checkpoint counters,
/// and its processes' memory. Labels stay low in cardinality: job_id (only
/// live jobs), phase, process, state.
std::string prometheus_text(const std::vector<job_view>& jobs);

} // namespace troupe::cluster
