#pragma once
// The controller's records (NOTE [controller restart] in controller.hpp):
// every job it was given — spec, resolved config, run directory, driver,
// state with every transition and its time, exit reason — and the audit
// log of mutating calls, in one SQLite file (WAL mode: a crash loses at
// most the transaction in flight, and readers never block the writer).
// Thread-safe: one connection behind a mutex.

#include "runtime/error.hpp"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace troupe::cluster {

struct job_record {
  std::string id;
  std::string name;
  /// The controller's state name (queued, pending, ..., lost).
  std::string state;
  /// The submitted job file's name and text, and the resolved config.
  std::string spec_name;
  std::string spec_text;
  std::string resolved_config;
  /// The job's folder under the controller's jobs root, and its run dir.
  std::string job_dir;
  std::string run_dir;
  std::string submitter;
  int64_t submit_time_us = 0;
  int64_t start_time_us = 0;
  int64_t end_time_us = 0;
  std::string error;
  std::string exit_reason;
  int64_t driver_pid = 0;
  int64_t last_seq = 0;
  /// Cores the job holds while it runs (admission).
  int64_t cores = 1;
  /// Its next driver continues from the run's checkpoints.
  bool resume = false;
  /// A checkpoint or a finished stage exists to continue from.
  bool resumable = false;
  /// Where it got to (kept for listings after the job's end).
  std::string stage;
  int64_t iteration = 0;
  int64_t total = 0;
};

struct transition_record {
  std::string state;
  int64_t time_us = 0;
  std::string reason;
};

struct audit_record {
  int64_t time_us = 0;
  /// The caller: its address, and the name it gave or its certificate's.
  std::string who;
  /// The RPC ("SubmitJob") and its target (a job id).
  std::string what;
  std::string target;
  /// "ok" or the status it got ("FAILED_PRECONDITION: ...").
  std::string result;
};

class job_store {
public:
  /// Opens (creating when absent) the database at `path`.
  static expected<std::unique_ptr<job_store>> open(const std::string& path);
  ~job_store();

  /// Adds a new job (its id must be new).
  expected<void> insert(const job_record& r);
  /// Writes every field of an existing job.
  expected<void> update(const job_record& r);
  /// Records a state change (and sets the job's state).
  expected<void> add_transition(const std::string& id, const transition_record& t);

  /// Every job, oldest first.
  expected<std::vector<job_record>> jobs();
  expected<std::optional<job_record>> find(const std::string& id);
  expected<std::vector<transition_record>> transitions(const std::string& id);

  expected<void> audit(const audit_record& a);
  /// The last `limit` audit entries, oldest first.
  expected<std::vector<audit_record>> audit_log(int64_t limit);

private:
  job_store() = default;
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace troupe::cluster
