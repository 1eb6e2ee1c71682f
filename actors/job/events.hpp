#pragma once
// The job's event vocabulary: every kind of event a job emits, declared
// once, here (a later gRPC API mirrors it one to one).
//
// NOTE [job events]: an event is a sequence number (per job, contiguous
// from 1), a timestamp (µs since the Unix epoch) and one payload struct of
// the `event_body` variant. Each payload describes its fields once, in
// `fields(f, x)`, and that one description serves the JSON form — one
// object per line of `<run dir>/events.jsonl`, `{"seq", "time_us", "kind",
// ...fields}` — which is also the wire form of an event between processes
// (inspect below). The kinds:
//
//   state           the job's state changed (from, to, reason)
//   stage_started   a stage began (stage, total steps, first step)
//   stage_finished  a stage ended (stage, steps, seconds, stopped early)
//   phase_started   a phase of a step began (stage, iteration, phase)
//   phase_finished  ... and ended (seconds)
//   metrics         one step's metrics (stage, step, total, map)
//   weight_sync     weights from one role to another (version, transport,
//                   bytes, s, from, to, each end's temporary bytes)
//   checkpoint      a checkpoint was committed (stage, step, path, bytes, s)
//   role            a role rank started / became ready / failed
//                   (role, rank, process, pid, status, reason, signal, phase)
//   eval_samples    a few (prompt, response, score) triples of an evaluation
//                   (with episodes: each one's conversation, turn by turn)
//   log             a log line (level, text)
//   setting         a runtime setting changed (key, value, previous, from
//                   iteration)

#include "runtime/enum_names.hpp"
#include "runtime/error.hpp"
#include "runtime/wire_float.hpp"

#include <caf/meta/load_callback.hpp>
#include <caf/meta/save_callback.hpp>
#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace troupe::actors::job {

/// NOTE [job states] in state.hpp.
enum class job_state : uint8_t {
  pending,
  preparing,
  running,
  paused,
  succeeded,
  failed,
  cancelled
};
TROUPE_ENUM_NAMES(job_state, "pending", "preparing", "running", "paused", "succeeded", "failed",
                  "cancelled")

std::optional<job_state> parse_job_state(std::string_view s) noexcept;
/// succeeded, failed or cancelled: nothing happens to the job any more.
bool is_final(job_state s) noexcept;

using runtime::metric_map;

/// A field added to a payload after journals were written without it: a
/// reader finds it absent in an older line and keeps the default; writers
/// always write it. `fields()` marks one as `f("key", added(x.member))`.
template <class T>
struct added_field {
  T& value;
};
template <class T>
added_field<T> added(T& v) {
  return {v};
}

struct state_changed {
  static constexpr const char* kind = "state";
  job_state from = job_state::pending;
  job_state to = job_state::pending;
  std::string reason;
};
template <class F>
void fields(F& f, state_changed& x) {
  f("from", x.from), f("to", x.to), f("reason", x.reason);
}

struct stage_started {
  static constexpr const char* kind = "stage_started";
  std::string stage;
  int64_t total = 0;
  /// The first step this run does (> 0 when resumed).
  int64_t from_step = 0;
};
template <class F>
void fields(F& f, stage_started& x) {
  f("stage", x.stage), f("total", x.total), f("from_step", x.from_step);
}

struct stage_finished {
  static constexpr const char* kind = "stage_finished";
  std::string stage;
  int64_t steps = 0;
  double seconds = 0;
  /// Ended early (cancelled); a checkpoint holds its progress unless `now`.
  bool stopped = false;
};
template <class F>
void fields(F& f, stage_finished& x) {
  f("stage", x.stage), f("steps", x.steps), f("seconds", x.seconds), f("stopped", x.stopped);
}

struct phase_started {
  static constexpr const char* kind = "phase_started";
  std::string stage;
  /// The iteration (step) the phase belongs to, counted from 1.
  int64_t iteration = 0;
  std::string phase;
};
template <class F>
void fields(F& f, phase_started& x) {
  f("stage", x.stage), f("iteration", x.iteration), f("phase", x.phase);
}

struct phase_finished {
  static constexpr const char* kind = "phase_finished";
  std::string stage;
  int64_t iteration = 0;
  std::string phase;
  double seconds = 0;
  /// False when the phase failed (the job fails with it).
  bool ok = true;
};
template <class F>
void fields(F& f, phase_finished& x) {
  f("stage", x.stage), f("iteration", x.iteration), f("phase", x.phase), f("seconds", x.seconds),
      f("ok", x.ok);
}

struct metrics_reported {
  static constexpr const char* kind = "metrics";
  std::string stage;
  int64_t step = 0;
  int64_t total = 0;
  metric_map metrics;
};
template <class F>
void fields(F& f, metrics_reported& x) {
  f("stage", x.stage), f("step", x.step), f("total", x.total), f("metrics", x.metrics);
}

struct weight_synced {
  static constexpr const char* kind = "weight_sync";
  std::string stage;
  int64_t version = 0;
  std::string transport;
  int64_t bytes = 0;
  double seconds = 0;
  /// The role that published the weights and the one that took them in
  /// (role names: "policy", "rollout"); empty in journals written before
  /// the fields existed, which were always policy → rollout.
  std::string from;
  std::string to;
  /// The temporary bytes each end held for the version at most (a group:
  /// its largest rank's; NOTE [sync staging]); 0 in older journals.
  int64_t publisher_temporary_bytes = 0;
  int64_t receiver_temporary_bytes = 0;
};
template <class F>
void fields(F& f, weight_synced& x) {
  f("stage", x.stage), f("version", x.version), f("transport", x.transport), f("bytes", x.bytes),
      f("seconds", x.seconds), f("from", added(x.from)), f("to", added(x.to)),
      f("publisher_temporary_bytes", added(x.publisher_temporary_bytes)),
      f("receiver_temporary_bytes", added(x.receiver_temporary_bytes));
}

struct checkpoint_saved {
  static constexpr const char* kind = "checkpoint";
  std::string stage;
  int64_t step = 0;
  std::string path;
  int64_t bytes = 0;
  double seconds = 0;
};
template <class F>
void fields(F& f, checkpoint_saved& x) {
  f("stage", x.stage), f("step", x.step), f("path", x.path), f("bytes", x.bytes),
      f("seconds", x.seconds);
}

struct role_changed {
  static constexpr const char* kind = "role";
  std::string stage;
  std::string role;
  int32_t rank = 0;
  /// "driver" (the job's own process) or the worker's label.
  std::string process;
  int64_t pid = 0;
  /// started | ready | failed | restarting | restarted (NOTE [supervision]).
  std::string status;
  /// Why it failed or restarts (the loss).
  std::string reason;
  /// The signal that ended the role's process (failed, restarting), else 0.
  int32_t signal = 0;
  /// The phase it failed or was lost in ("" outside one).
  std::string phase;
  /// The node of its process ("" = the driver's machine).
  std::string node;
  /// restarting / restarted: the role's restart count, from 1.
  int32_t attempt = 0;
  /// restarted: seconds from the loss being seen to the role working again.
  double recover_s = 0;
};
template <class F>
void fields(F& f, role_changed& x) {
  f("stage", x.stage), f("role", x.role), f("rank", x.rank), f("process", x.process),
      f("pid", x.pid), f("status", x.status), f("reason", x.reason), f("signal", x.signal),
      f("phase", x.phase), f("node", x.node), f("attempt", added(x.attempt)),
      f("recover_s", added(x.recover_s));
}

struct eval_sample {
  std::string prompt;
  std::string response;
  double score = 0;
  /// An episode's conversation (NOTE [episodes]): its messages as a JSON
  /// list, [{"role", "content", "turn"}, ...] — the model's turns and the
  /// observations, each with the turn it belongs to; "" = not an episode
  /// (written only when set; older lines lack it).
  std::string conversation;
};

struct eval_samples {
  static constexpr const char* kind = "eval_samples";
  std::string stage;
  int64_t step = 0;
  std::vector<eval_sample> samples;
};
template <class F>
void fields(F& f, eval_samples& x) {
  f("stage", x.stage), f("step", x.step), f("samples", x.samples);
}

struct log_line {
  static constexpr const char* kind = "log";
  /// trace | debug | info | warn | error.
  std::string level;
  std::string text;
};
template <class F>
void fields(F& f, log_line& x) {
  f("level", x.level), f("text", x.text);
}

struct setting_updated {
  static constexpr const char* kind = "setting";
  std::string key;
  std::string value;
  std::string previous;
  /// The first iteration that runs with the new value.
  int64_t iteration = 0;
};
template <class F>
void fields(F& f, setting_updated& x) {
  f("key", x.key), f("value", x.value), f("previous", x.previous), f("iteration", x.iteration);
}

using event_body = std::variant<state_changed, stage_started, stage_finished, phase_started,
                                phase_finished, metrics_reported, weight_synced, checkpoint_saved,
                                role_changed, eval_samples, log_line, setting_updated>;

struct event {
  int64_t seq = 0;
  int64_t time_us = 0;
  event_body body;
};

/// The kind name of `e` ("state", "metrics", ...).
std::string_view kind_of(const event_body& e) noexcept;
/// Every kind name, in the variant's order.
std::vector<std::string_view> event_kinds();

/// One JSON object (no newline): the journal line and wire form of `e`.
std::string to_json(const event& e);
/// Parses a line written by to_json; errors say what is wrong.
expected<event> event_from_json(std::string_view line);

/// Calls `fn` with each complete line of a journal's text that parses and
/// answers the length of the complete part (a torn last line, written by a
/// process killed mid-write, is left out).
size_t each_journal_event(std::string_view text, const std::function<void(const event&)>& fn);

/// Microseconds since the Unix epoch, now.
int64_t now_us() noexcept;

/// CAF serialisation: an event crosses processes as its JSON line.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, event& x) {
  std::string line;
  auto save = caf::meta::save_callback([&]() -> caf::error {
    line = to_json(x);
    return caf::error{};
  });
  auto load = caf::meta::load_callback([&]() -> caf::error {
    auto e = event_from_json(line);
    if (!e)
      return e.error();
    x = std::move(*e);
    return caf::error{};
  });
  return f(caf::meta::type_name("job_event"), save, line, load);
}

} // namespace troupe::actors::job
