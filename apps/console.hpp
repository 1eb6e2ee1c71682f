#pragma once
// The terminal's view of a job, shared by `troupe run` (a subscriber of the
// job actor in this process) and `troupe watch` (events from the
// controller): a progress bar or line per step, pauses, role failures.
// Also the signal handling of processes that run a job (`troupe run`,
// `troupe driver`): NOTE [stop signals].

#include "actors/job/job_actor.hpp"
#include "actors/rl/job_choices.hpp"

#include <caf/fwd.hpp>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace troupe::apps {

/// "1h02m", "3m07s", "12s", "?" (not finite).
std::string duration(double seconds);

class console_view {
public:
  /// auto: a bar on a terminal, else lines.
  explicit console_view(actors::rl::progress_style mode);
  /// Prints what `e` says; true once the job reached a final state.
  bool on_event(const actors::job::event& e);
  /// Ends a bar's line (before other output).
  void end_line();

private:
  void step(const actors::job::metrics_reported& m, double elapsed_s, int64_t done);
  actors::rl::progress_style mode_;
  int64_t stage_start_us_ = 0;
  int64_t stage_from_ = 0;
};

/// An actor that shows the events it receives on `view` and quits at the
/// job's final state, or when the job actor ends without one.
caf::actor spawn_console(caf::actor_system& sys, console_view* view, const actors::job::job_actor& job);

/// NOTE [stop signals]: in a process that runs a job, SIGINT cancels it at
/// the next consistent boundary with a checkpoint (resume continues from
/// it); SIGTERM, or a second signal of either kind, cancels it now, with no
/// checkpoint. Either way the process ends within a bound, whatever state
/// the job is in (preparing, running, paused, or stuck in a request): 8 s
/// after SIGTERM or a second signal (inside the 10 s a supervisor such as
/// systemd or Slurm allows before SIGKILL), and after SIGINT the longest a request
/// may take plus the checkpoint's time (the run's timeouts). Past the bound
/// it says so on stderr and exits at once with 128 + the first signal, as
/// it does when the job stopped in time; its worker processes die with it
/// (PR_SET_PDEATHSIG). A third signal takes the default action at once.
/// The handler only counts and wakes a watcher thread through a pipe
/// (async-signal-safe); the thread sends the cancel and keeps the bound.
struct stop_bounds {
  double now_s = 8;
  double checkpoint_s = 10;
};

class signal_watcher {
public:
  explicit signal_watcher(stop_bounds bounds = {});
  ~signal_watcher();
  signal_watcher(const signal_watcher&) = delete;
  signal_watcher& operator=(const signal_watcher&) = delete;
  /// From now on signals cancel `job` (one that came earlier does at once).
  void watch(const actors::job::job_actor& job);
  /// Drops the job's handle (before its actor system ends); the bound stays.
  void forget();
  /// Whether the job was told to stop now (no checkpoint).
  static bool stopped_now();
  /// 128 + the first signal's number (130 for SIGINT, 143 for SIGTERM).
  static int exit_status();

private:
  void loop();
  void send();
  stop_bounds bounds_;
  std::mutex mu_;
  std::optional<actors::job::job_actor> job_;
  std::thread thread_;
};

} // namespace troupe::apps
