#pragma once
// `troupe run`: a job's stages (sft → rm → rl) with their driver actors, in
// one process. Each stage is one single-controller driver (a detached
// blocking actor) that sends requests to the role actors and waits for the
// answers within run.request_timeout_s; a role that fails ends the job with
// an error naming the role and the phase.
//
// The run directory holds metrics.jsonl (one JSON object per step: "stage",
// "step" and the metrics under verl's names), base/model (the random base
// model, when model.path is empty), <stage>/model (each stage's output),
// <stage>/checkpoints/ (NOTE [checkpoint commit] in runtime/checkpoint.hpp)
// and <stage>/done (written when the stage has finished).

#include "actors/rl/job_config.hpp"
#include "actors/train/train_engine.hpp"

#include <atomic>
#include <caf/fwd.hpp>
#include <functional>
#include <string>
#include <vector>

namespace troupe::actors::rl {

class role_host;

/// One step of a stage, for progress displays.
struct progress_event {
  std::string stage;
  int64_t step = 0;
  int64_t total = 0;
  train::metric_map metrics;
  /// Seconds since the stage started (this process).
  double elapsed_s = 0;
};

struct run_options {
  /// Continue from the run directory's checkpoints (finished stages are
  /// skipped); without it an existing run directory with metrics is an error.
  bool resume = false;
  std::function<void(const progress_event&)> on_progress;
  /// Set (e.g. by SIGINT) to stop after the current phase with a checkpoint.
  const std::atomic<bool>* stop = nullptr;
  /// Where the roles run (e.g. cluster::worker_host for worker processes);
  /// null = every role in this process.
  role_host* host = nullptr;
};

struct stage_summary {
  std::string stage;
  int64_t steps = 0;
  /// The stage's last metrics (including its held-out score).
  train::metric_map metrics;
  double seconds = 0;
  /// Output model directory.
  std::string output;
  bool skipped = false;
  /// Ended early by a stop request (a checkpoint holds its progress).
  bool stopped = false;
};

struct job_summary {
  std::string run_dir;
  std::vector<stage_summary> stages;
  /// True when a stop request ended the run early (resume with --resume).
  bool stopped = false;
};

/// Runs every stage of `cfg` (already validated by load_job).
expected<job_summary> run_job(caf::actor_system& sys, const job_config& cfg, const run_options& opts);

} // namespace troupe::actors::rl
