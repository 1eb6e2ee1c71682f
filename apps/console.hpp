#pragma once
// The terminal's view of a job, shared by `troupe run` (a subscriber of the
// job actor in this process) and `troupe watch` (events from the
// controller): a progress bar or line per step, pauses, role failures.
// Also the signal handling of processes that run a job (`troupe run`,
// `troupe driver`): SIGINT / SIGTERM cancel it (checkpoint, then stop), a
// second cancels --now, a third takes the default action.

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
/// job's final state.
caf::actor spawn_console(caf::actor_system& sys, console_view* view);

/// Turns SIGINT / SIGTERM into cancel commands to a job actor. One per
/// process; the handler only counts and wakes a watcher thread through a
/// pipe (async-signal-safe).
class signal_watcher {
public:
  signal_watcher();
  ~signal_watcher();
  signal_watcher(const signal_watcher&) = delete;
  signal_watcher& operator=(const signal_watcher&) = delete;
  /// From now on signals cancel `job` (one that came earlier does at once).
  void watch(const actors::job::job_actor& job);
  /// Signals received so far.
  static int count();

private:
  void loop();
  void send();
  std::mutex mu_;
  std::optional<actors::job::job_actor> job_;
  std::thread thread_;
};

} // namespace troupe::apps
