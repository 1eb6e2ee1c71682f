#pragma once
// The job actor: one per job, event-based, the owner of the job's state
// (NOTE [job states] in state.hpp) and of its event stream (NOTE [job
// events] in events.hpp). Several jobs can live in one actor system.
//
// NOTE [job boundaries]: the job's driver — a detached blocking actor that
// the job actor starts, running the stages and their phases — stays in
// charge of the work; the job actor serves commands at once and hands them
// to the driver between phases. At every phase boundary the driver calls
// driver_link::boundary. When nothing is pending (the common case) that is
// one relaxed atomic load — no message; when a command is pending the job
// actor has raised the link's attention flag, and the driver asks the job
// actor what to do:
//   pause       the job actor holds the reply (state paused) until resume or
//               cancel; the roles keep their state, and the held time is
//               excluded from the step's timings;
//   checkpoint  the driver writes one at the next boundary where the state is
//               consistent (before the iteration's first update, or at its
//               end);
//   cancel      the driver stops at the next consistent boundary with a
//               checkpoint (cancel --now: at the next boundary, without one);
//   update      validated when it arrives (refused with the key and reason),
//               applied by the driver at the start of the next iteration.
// Breakpoints (`pause_at STAGE:STEP[:PHASE]`) pause at one boundary; the
// tests use them to pause and cancel at every boundary of a step.

#include "actors/job/events.hpp"
#include "actors/job/state.hpp"

#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace troupe::actors::job {

// Commands.
using status_atom = caf::atom_constant<caf::atom("jstatus")>;
using start_atom = caf::atom_constant<caf::atom("jstart")>;
using pause_atom = caf::atom_constant<caf::atom("jpause")>;
using pause_at_atom = caf::atom_constant<caf::atom("jpauseat")>;
using resume_atom = caf::atom_constant<caf::atom("jresume")>;
using cancel_atom = caf::atom_constant<caf::atom("jcancel")>;
using checkpoint_atom = caf::atom_constant<caf::atom("jckpt")>;
using update_atom = caf::atom_constant<caf::atom("jupdate")>;
using subscribe_atom = caf::atom_constant<caf::atom("jsub")>;
using unsubscribe_atom = caf::atom_constant<caf::atom("junsub")>;
using await_atom = caf::atom_constant<caf::atom("jawait")>;
// The driver's side.
using emit_atom = caf::atom_constant<caf::atom("jemit")>;
using boundary_atom = caf::atom_constant<caf::atom("jbound")>;
using prepared_atom = caf::atom_constant<caf::atom("jprep")>;
using driver_done_atom = caf::atom_constant<caf::atom("jdone")>;

/// What `status` answers (and every command, after it is taken).
struct job_status {
  std::string id;
  std::string name;
  job_state state = job_state::pending;
  std::string stage;
  /// Steps done of the current stage, and its total.
  int64_t iteration = 0;
  int64_t total = 0;
  /// The phase running now ("" between phases).
  std::string phase;
  int64_t start_time_us = 0;
  /// Seconds to the end of the current stage (NaN before its first step).
  double eta_s = 0;
  metric_map last_metrics;
  /// Weight version per role (the rollout's = the last sync's).
  std::map<std::string, int64_t> weight_versions;
  /// Why the job failed ("" otherwise).
  std::string error;
  /// The last event's sequence number.
  int64_t last_seq = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, job_status& x) {
  std::string state;
  auto save = caf::meta::save_callback([&]() -> caf::error {
    state = std::string{to_string(x.state)};
    return caf::error{};
  });
  auto load = caf::meta::load_callback([&]() -> caf::error {
    auto s = parse_job_state(state);
    if (!s)
      return make_error(errc::parse_error, "job_status: unknown state " + state);
    x.state = *s;
    return caf::error{};
  });
  return f(caf::meta::type_name("job_status"), save, x.id, x.name, state, x.stage, x.iteration,
           x.total, x.phase, x.start_time_us, runtime::wire(x.eta_s), x.last_metrics,
           x.weight_versions, x.error, x.last_seq, load);
}

/// What an event says about the job's status (stage, iteration, phase,
/// metrics, weight versions): the job actor's status and the controller's
/// view of a job are this fold over the event stream.
void track(job_status& st, const event_body& e);

/// Where the driver is: between phases of step `iteration` of `stage`.
struct boundary_point {
  std::string stage;
  int64_t iteration = 0;
  /// The phase just finished ("" = the step is about to begin).
  std::string after;
  /// A checkpoint here holds a state a resumed run continues exactly from.
  bool consistent = false;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, boundary_point& x) {
  return f(caf::meta::type_name("boundary_point"), x.stage, x.iteration, x.after, x.consistent);
}

/// The driver's orders at a boundary (NOTE [job boundaries]).
struct boundary_reply {
  bool checkpoint = false;
  bool cancel = false;
  /// cancel --now: stop here, no checkpoint.
  bool now = false;
  /// Ask again after the checkpoint (it was taken while paused).
  bool again = false;
  /// Seconds the driver was held here (paused).
  double held_s = 0;
  /// Runtime settings (key, value) to apply from this step on.
  std::vector<std::pair<std::string, std::string>> settings;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, boundary_reply& x) {
  return f(caf::meta::type_name("boundary_reply"), x.checkpoint, x.cancel, x.now, x.again,
           runtime::wire(x.held_s), x.settings);
}

using job_actor = caf::typed_actor<
    caf::replies_to<status_atom>::with<job_status>, caf::replies_to<start_atom>::with<job_status>,
    caf::replies_to<pause_atom>::with<job_status>,
    caf::replies_to<pause_at_atom, std::string>::with<job_status>,
    caf::replies_to<resume_atom>::with<job_status>,
    caf::replies_to<cancel_atom, bool>::with<job_status>,
    caf::replies_to<checkpoint_atom>::with<job_status>,
    caf::replies_to<update_atom, std::string, std::string>::with<job_status>,
    // The subscriber receives `event` messages from `from_seq` on; the reply
    // is the next sequence number.
    caf::replies_to<subscribe_atom, caf::actor, int64_t>::with<int64_t>,
    caf::reacts_to<unsubscribe_atom, caf::actor>,
    // Answers once the job is in a final state.
    caf::replies_to<await_atom>::with<job_status>, caf::reacts_to<emit_atom, event>,
    caf::replies_to<boundary_atom, boundary_point>::with<boundary_reply>,
    // The driver's end: the final state's name, and the error ("" = none).
    caf::reacts_to<prepared_atom>, caf::reacts_to<driver_done_atom, std::string, std::string>>;

/// The driver's handle on its job actor.
class driver_link {
public:
  driver_link(job_actor job, std::shared_ptr<std::atomic<bool>> attention)
      : job_(std::move(job)), attention_(std::move(attention)) {}

  /// Sends an event (the job actor numbers and journals it).
  void emit(event_body e) const;
  /// Sends a log line (an event; the job's logger also writes troupe.log).
  void log(std::string level, std::string text) const;
  /// NOTE [job boundaries]: {} unless a command is pending; else the job
  /// actor's orders (this call blocks while the job is paused).
  expected<boundary_reply> boundary(caf::blocking_actor* self, const boundary_point& p) const;
  /// The preparation is done: the job is running.
  void prepared() const;

  const job_actor& job() const { return job_; }

private:
  job_actor job_;
  std::shared_ptr<std::atomic<bool>> attention_;
};

/// What the driver ends with: succeeded, cancelled or failed (with why).
struct driver_outcome {
  job_state state = job_state::failed;
  std::string error;
};

/// Runs in a detached actor of its own once the job starts.
using driver_fn = std::function<driver_outcome(caf::blocking_actor*, driver_link&)>;

struct job_options {
  std::string id;
  std::string name;
  /// The journal; "" = none. Opened at start (parents created).
  std::string journal_path;
  /// Continue the journal's numbering (a resumed run) instead of starting it anew.
  bool append_journal = false;
  /// Events kept in memory for late subscribers (older ones come from the journal).
  size_t ring_capacity = 4096;
  /// Called in order for every event, in the job actor (metrics files,
  /// loggers); the first error fails the job at its end.
  std::vector<std::function<expected<void>(const event&)>> sinks;
  /// Checks a runtime setting (key, value); refused with a reason.
  std::function<expected<std::string>(const std::string& key, const std::string& value)>
      check_update;
  driver_fn driver;
};

/// Spawns a pending job actor.
job_actor spawn_job(caf::actor_system& sys, job_options options);

/// A breakpoint "STAGE:STEP[:PHASE]": pause at the boundary after PHASE of
/// step STEP (no phase: before the step begins).
struct breakpoint {
  std::string stage;
  int64_t step = 0;
  std::string phase;
};
expected<breakpoint> parse_breakpoint(const std::string& text);

} // namespace troupe::actors::job
