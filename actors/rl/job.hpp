#pragma once
// `troupe run`: a job's stages (sft → rm → rl) as one job actor (NOTE [job
// states], [job events], [job boundaries] in actors/job/). Its driver — a
// single controller in a detached blocking actor — runs the stages in
// order, sending requests to the role actors and waiting for the answers
// within run.timeouts (by kind of request); a role that fails ends the job (state
// failed) with an error naming the role, the phase and the iteration.
//
// The run directory holds metrics.jsonl (one JSON object per step: "stage",
// "step" and the metrics under verl's names), base/model (the random base
// model, when model.path is empty), <stage>/model (each stage's output),
// <stage>/checkpoints/ (NOTE [checkpoint commit] in runtime/checkpoint.hpp)
// and <stage>/done (written when the stage has finished), events.jsonl (the
// job's journal), troupe.log (its log) and settings.jsonl (NOTE [runtime
// settings] in settings.hpp).

#include "actors/job/job_actor.hpp"
#include "actors/rl/job_config.hpp"
#include "actors/rl/roles.hpp"
#include "actors/train/train_engine.hpp"

#include <atomic>
#include <caf/fwd.hpp>
#include <functional>
#include <string>
#include <vector>

namespace troupe::actors::rl {

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
  /// Called by the driver after each step (synchronously: it may set `stop`).
  std::function<void(const progress_event&)> on_progress;
  /// Read at every phase boundary: set = cancel (with a checkpoint).
  const std::atomic<bool>* stop = nullptr;
  /// Called with the job actor before it starts (to subscribe, or to keep
  /// its handle for commands).
  std::function<void(const job::job_actor&)> on_spawn;
  /// Where the roles run (e.g. cluster::worker_host for worker processes);
  /// null = every role in this process.
  role_host* host = nullptr;
  /// Parts of the roles built in this process that are not the built-in
  /// ones (a reward backend; NOTE [reward backends]). A `host` builds its
  /// roles with its own.
  role_factories factories;
  /// Every scalar also as TensorBoard files under <run dir>/tensorboard/
  /// (NOTE [tensorboard files]).
  bool tensorboard = true;
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

/// A pending job actor for `cfg` (already validated by load_job), and where
/// its summary lands once it has ended. Refuses at once (nothing spawned) a
/// run directory that already holds a run without opts.resume, and a
/// placement that does not fit.
struct rl_job {
  job::job_actor actor;
  struct outcome {
    job_summary summary;
    caf::error error;
  };
  /// Written by the driver before the job reaches its final state.
  std::shared_ptr<outcome> result;
};
expected<rl_job> spawn_rl_job(caf::actor_system& sys, const job_config& cfg, const run_options& opts);

/// Spawns the job actor, starts it and waits for its end: the summary
/// (stopped = cancelled with a checkpoint), or the error it failed with.
expected<job_summary> run_job(caf::actor_system& sys, const job_config& cfg, const run_options& opts);

} // namespace troupe::actors::rl
