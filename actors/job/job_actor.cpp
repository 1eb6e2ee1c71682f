#include "actors/job/job_actor.hpp"

#include "actors/exceptions.hpp"
#include "runtime/file_io.hpp"

#include <caf/all.hpp>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <optional>

namespace troupe::actors::job {

namespace {

using clock = std::chrono::steady_clock;

double since(clock::time_point t) {
  return std::chrono::duration<double>(clock::now() - t).count();
}

struct job_state_data {
  job_options opt;
  job_fsm fsm;
  job_status st;
  int64_t seq = 0;
  std::deque<event> ring;
  std::FILE* journal = nullptr;
  // NOTE [job actor failures]: the first failure inside the job actor (the
  // journal's or a sink's write, a throwing sink); the job ends failed with it.
  std::string failure;
  std::vector<bool> sink_dead; // a failed sink is not called again
  std::vector<caf::actor> subscribers;
  std::vector<caf::response_promise> awaiting;
  std::shared_ptr<std::atomic<bool>> attention = std::make_shared<std::atomic<bool>>(false);
  // Commands waiting for the driver's next boundary.
  bool pause_pending = false;
  bool rehold = false;
  bool checkpoint_pending = false;
  bool cancel_pending = false;
  bool cancel_now = false;
  std::vector<breakpoint> breakpoints;
  std::vector<std::pair<std::string, std::string>> settings_pending;
  // The held boundary while paused.
  std::optional<caf::response_promise> held;
  boundary_reply held_reply;
  boundary_point held_at;
  clock::time_point held_since;
  // The current stage's clock, for the ETA.
  clock::time_point stage_t0 = clock::now();
  int64_t stage_from = 0;
  double stage_paused_s = 0;

  // A job actor that stops (killed, or its system shutting down) answers
  // what it still holds: a held driver and the awaiters must not wait on.
  ~job_state_data() {
    auto gone = caf::make_error(caf::sec::request_receiver_down);
    if (held && held->pending())
      held->deliver(gone);
    for (auto& p : awaiting)
      if (p.pending())
        p.deliver(gone);
    if (journal)
      std::fclose(journal);
  }
  static inline const char* name = "troupe.job";
};

using self_ptr = job_actor::stateful_pointer<job_state_data>;

void refresh_attention(job_state_data& s) {
  s.attention->store(s.pause_pending || s.rehold || s.checkpoint_pending || s.cancel_pending ||
                     !s.settings_pending.empty() || !s.breakpoints.empty());
}

void track(job_state_data& s, const event_body& b) {
  track(s.st, b);
  if (auto* e = std::get_if<stage_started>(&b))
    s.stage_t0 = clock::now(), s.stage_from = e->from_step, s.stage_paused_s = 0;
}

} // namespace

void track(job_status& st, const event_body& b) {
  if (auto* e = std::get_if<stage_started>(&b)) {
    st.stage = e->stage, st.total = e->total, st.iteration = e->from_step, st.phase.clear();
  } else if (auto* e = std::get_if<phase_started>(&b)) {
    st.phase = e->phase;
  } else if (std::holds_alternative<phase_finished>(b)) {
    st.phase.clear();
  } else if (auto* e = std::get_if<metrics_reported>(&b)) {
    st.iteration = e->step, st.total = e->total, st.last_metrics = e->metrics;
  } else if (auto* e = std::get_if<weight_synced>(&b)) {
    // An older journal's event has no roles: those were policy → rollout.
    st.weight_versions[e->from.empty() ? "policy" : e->from] = e->version;
    st.weight_versions[e->to.empty() ? "rollout" : e->to] = e->version;
  }
}

namespace {

void fail_soon(self_ptr self, std::string reason);

void write_journal(self_ptr self, const event& e) {
  auto& s = self->state;
  if (!s.journal)
    return;
  auto line = to_json(e) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), s.journal) != line.size() ||
      std::fflush(s.journal) != 0) {
    auto why = s.opt.journal_path + ": " + std::strerror(errno);
    std::fclose(s.journal);
    s.journal = nullptr;
    fail_soon(self, std::move(why));
  }
}

// Each sink sees `e` unless it failed before; a sink's error or exception
// fails the job (NOTE [job actor failures]).
void feed_sinks(self_ptr self, const event& e) {
  auto& s = self->state;
  for (size_t i = 0; i < s.opt.sinks.size(); ++i) {
    if (s.sink_dead[i])
      continue;
    std::string why;
    try {
      if (auto ok = s.opt.sinks[i](e); !ok)
        why = describe(ok.error());
    } catch (...) {
      why = "a sink threw: " + what_of(std::current_exception());
    }
    if (!why.empty()) {
      s.sink_dead[i] = true;
      fail_soon(self, std::move(why));
    }
  }
}

void publish(self_ptr self, event_body body) {
  auto& s = self->state;
  event e{++s.seq, now_us(), std::move(body)};
  track(s, e.body);
  write_journal(self, e);
  feed_sinks(self, e);
  for (const auto& sub : s.subscribers)
    caf::anon_send(sub, e);
  s.ring.push_back(std::move(e));
  while (s.ring.size() > std::max<size_t>(1, s.opt.ring_capacity))
    s.ring.pop_front();
}

void move_to(self_ptr self, job_state to, std::string reason = {}) {
  auto& s = self->state;
  auto from = s.fsm.state();
  if (!s.fsm.move(to))
    return; // not an edge: already there, or a late message after the end
  s.st.state = to;
  publish(self, state_changed{from, to, std::move(reason)});
  if (is_final(to)) {
    for (auto& p : s.awaiting)
      p.deliver(s.st);
    s.awaiting.clear();
    s.subscribers.clear();
    if (s.journal) {
      std::fclose(s.journal);
      s.journal = nullptr;
    }
  }
}

job_status status_of(job_state_data& s) {
  auto st = s.st;
  auto done = st.iteration - s.stage_from;
  double elapsed = since(s.stage_t0) - s.stage_paused_s - (s.held ? since(s.held_since) : 0.0);
  st.eta_s = done > 0 && st.total >= st.iteration ? elapsed / static_cast<double>(done) *
                                                        static_cast<double>(st.total - st.iteration)
                                                  : NAN;
  st.last_seq = s.seq;
  return st;
}

// Journal lines with seq in [from, until).
void replay_journal(self_ptr self, const caf::actor& sub, int64_t from, int64_t until) {
  auto text = runtime::read_file(self->state.opt.journal_path);
  if (!text)
    return;
  each_journal_event(*text, [&](const event& e) {
    if (e.seq >= from && e.seq < until)
      caf::anon_send(sub, e);
  });
}

expected<void> open_journal(job_state_data& s) {
  namespace fs = std::filesystem;
  if (s.opt.journal_path.empty())
    return {};
  std::error_code ec;
  fs::create_directories(fs::path{s.opt.journal_path}.parent_path(), ec);
  if (s.opt.append_journal && fs::exists(s.opt.journal_path, ec)) {
    // A resumed run numbers on from the journal's last complete line.
    auto text = runtime::read_file(s.opt.journal_path);
    if (!text)
      return text.error();
    auto complete = each_journal_event(*text, [&](const event& e) { s.seq = e.seq; });
    if (complete != text->size()) // a torn last line (killed mid-write) is dropped
      if (auto ok = runtime::write_file_atomic(s.opt.journal_path, text->substr(0, complete)); !ok)
        return ok;
  }
  s.journal = std::fopen(s.opt.journal_path.c_str(), s.opt.append_journal ? "a" : "w");
  if (!s.journal)
    return make_error(errc::io_error,
                      "cannot open " + s.opt.journal_path + ": " + std::strerror(errno));
  return {};
}

void start_driver(self_ptr self) {
  auto link = driver_link{caf::actor_cast<job_actor>(self), self->state.attention};
  auto fn = self->state.opt.driver;
  auto driver = self->spawn<caf::detached>([fn, link](caf::blocking_actor* b) mutable {
    driver_outcome out;
    try {
      out = fn ? fn(b, link) : driver_outcome{job_state::failed, "the job has no driver"};
    } catch (...) { // NOTE [escaping exceptions]: whatever it throws
      out = {job_state::failed, "driver: " + what_of(std::current_exception())};
    }
    caf::anon_send(link.job(), driver_done_atom::value, std::string{to_string(out.state)},
                   out.error);
  });
  self->monitor(driver);
  self->set_down_handler([self, driver](caf::down_msg& dm) {
    if (dm.source == driver) {
      move_to(self, job_state::failed, "the driver ended without a result");
      return;
    }
    auto& subs = self->state.subscribers;
    subs.erase(std::remove_if(subs.begin(), subs.end(),
                              [&](const caf::actor& a) { return a.address() == dm.source; }),
               subs.end());
  });
}

// Orders for the driver at boundary `p` (NOTE [job boundaries]).
boundary_reply orders(job_state_data& s, const boundary_point& p) {
  boundary_reply r;
  if (s.cancel_pending) {
    r.cancel = true, r.now = s.cancel_now;
    s.cancel_pending = false;
  }
  if (s.checkpoint_pending && p.consistent) {
    r.checkpoint = true;
    s.checkpoint_pending = false;
  }
  if (p.after.empty() && !s.settings_pending.empty())
    r.settings = std::exchange(s.settings_pending, {});
  return r;
}

bool hits_breakpoint(job_state_data& s, const boundary_point& p) {
  auto& bps = s.breakpoints;
  auto it = std::find_if(bps.begin(), bps.end(), [&](const breakpoint& b) {
    return b.stage == p.stage && b.step == p.iteration && b.phase == p.after;
  });
  if (it == bps.end())
    return false;
  bps.erase(it);
  return true;
}

caf::result<boundary_reply> on_boundary(self_ptr self, const boundary_point& p) {
  auto& s = self->state;
  s.st.stage = p.stage;
  auto r = orders(s, p);
  bool pause = !r.cancel && (s.rehold || s.pause_pending || hits_breakpoint(s, p));
  if (!pause) {
    refresh_attention(s);
    return r;
  }
  s.pause_pending = false;
  bool again = std::exchange(s.rehold, false);
  s.held = self->make_response_promise<boundary_reply>();
  s.held_reply = std::move(r);
  s.held_at = p;
  if (!again) {
    s.held_since = clock::now();
    move_to(self, job_state::paused,
            "at " + p.stage + " step " + std::to_string(p.iteration) +
                (p.after.empty() ? " (start)" : " after " + p.after));
  }
  refresh_attention(s);
  return *s.held;
}

void release_held(self_ptr self) {
  auto& s = self->state;
  if (!s.held)
    return;
  if (s.held_at.after.empty() && !s.settings_pending.empty()) {
    auto more = std::exchange(s.settings_pending, {});
    s.held_reply.settings.insert(s.held_reply.settings.end(), more.begin(), more.end());
  }
  s.held_reply.held_s = since(s.held_since);
  auto p = std::move(*s.held);
  s.held.reset();
  p.deliver(std::exchange(s.held_reply, {}));
}

// Breakpoints may be set before start (pause may not): refused once final.
expected<void> breakpoint_allowed(const job_state_data& s) {
  if (is_final(s.fsm.state()))
    return s.fsm.check(command::pause);
  return {};
}

// A command: refused when the state does not allow `c` or `act` refuses;
// else the attention flag follows what is pending, and the status answers.
template <class F>
caf::result<job_status> command_then(self_ptr self, command c, F act) {
  auto& s = self->state;
  if (auto ok = s.fsm.check(c); !ok)
    return ok.error();
  if (expected<void> ok = act(s); !ok)
    return ok.error();
  refresh_attention(s);
  return status_of(s);
}

expected<void> start(self_ptr self) {
  auto& s = self->state;
  if (auto ok = open_journal(s); !ok) {
    s.st.error = describe(ok.error());
    move_to(self, job_state::failed, s.st.error);
    return ok;
  }
  s.st.start_time_us = now_us();
  move_to(self, job_state::preparing);
  start_driver(self);
  return {};
}

void resume(self_ptr self) {
  auto& s = self->state;
  // A checkpoint taken while paused may still be on its way back to the
  // boundary: it must not be held again once resumed.
  s.rehold = false;
  s.stage_paused_s += since(s.held_since);
  release_held(self);
  move_to(self, job_state::running, "resumed");
}

void cancel(self_ptr self, bool now) {
  auto& s = self->state;
  if (s.fsm.state() == job_state::pending) {
    move_to(self, job_state::cancelled, "cancelled before it started");
    return;
  }
  s.cancel_now = s.cancel_now || now;
  s.pause_pending = s.rehold = false;
  if (!s.held) {
    s.cancel_pending = true;
    return;
  }
  s.held_reply.cancel = true, s.held_reply.now = s.cancel_now;
  release_held(self);
}

// NOTE [job actor failures]: what fails inside the job actor itself — the
// journal's write, a sink (an error or an exception), an exception escaping
// one of its handlers — fails the job, and promptly: the driver is told to
// stop at its next boundary without a checkpoint (as `cancel --now`), and
// when it has stopped the job ends `failed` with the first failure as its
// error. The journal keeps every event up to then and the final state; a
// failed sink is not called again. An exception ends the actor itself
// (CAF's rule), so its handler does the end's work first: it journals the
// failed state, answers the awaiters, and raises the attention flag so the
// driver's next boundary asks, finds the actor gone, and fails.
void fail_soon(self_ptr self, std::string reason) {
  auto& s = self->state;
  if (!s.failure.empty())
    return;
  s.failure = std::move(reason);
  if (is_final(s.fsm.state()) || s.fsm.state() == job_state::pending)
    return;
  cancel(self, true);
  refresh_attention(s);
}

caf::error on_exception(self_ptr self, std::exception_ptr& ep) {
  auto& s = self->state;
  auto err = error_of_exception(ep, "job actor");
  try {
    s.failure = describe(err);
    s.attention->store(true);
    s.st.error = s.failure;
    move_to(self, job_state::failed, s.failure);
  } catch (...) {
    // Ending anyway: the destructor answers whoever still waits.
  }
  return err;
}

void checkpoint(self_ptr self) {
  auto& s = self->state;
  if (!s.held || !s.held_at.consistent) {
    s.checkpoint_pending = true;
    return;
  }
  // Taken now, while paused; the driver comes back to be held again.
  s.held_reply.checkpoint = s.held_reply.again = true;
  s.rehold = true;
  s.stage_paused_s += since(s.held_since);
  release_held(self);
  s.held_since = clock::now();
}

expected<void> update(job_state_data& s, const std::string& key, const std::string& value) {
  if (!s.opt.check_update)
    return make_error(errc::unsupported, "this job has no runtime settings");
  auto v = s.opt.check_update(key, value);
  if (!v)
    return v.error();
  s.settings_pending.emplace_back(key, *v);
  return {};
}

// The events from `from` (older ones from the journal), then live ones.
int64_t subscribe(self_ptr self, const caf::actor& sub, int64_t from) {
  auto& s = self->state;
  from = std::max<int64_t>(from, 1);
  int64_t ring_first = s.ring.empty() ? s.seq + 1 : s.ring.front().seq;
  if (from < ring_first && !s.opt.journal_path.empty())
    replay_journal(self, sub, from, ring_first);
  for (const auto& e : s.ring)
    if (e.seq >= from)
      caf::anon_send(sub, e);
  if (!is_final(s.fsm.state())) {
    s.subscribers.push_back(sub);
    self->monitor(sub);
  }
  return s.seq + 1;
}

void driver_done(self_ptr self, const std::string& state, const std::string& error) {
  auto& s = self->state;
  auto to = parse_job_state(state).value_or(job_state::failed);
  s.held.reset();
  if (s.fsm.state() == job_state::preparing && to == job_state::succeeded)
    move_to(self, job_state::running);
  s.st.error = error;
  if (!s.failure.empty()) {
    // The driver stopped (or finished) after the failure: it is the cause.
    to = job_state::failed;
    s.st.error = s.failure;
  }
  move_to(self, to, s.st.error);
}

job_actor::behavior_type job_behavior(self_ptr self, job_options opt) {
  auto& s = self->state;
  s.opt = std::move(opt);
  s.st.id = s.opt.id;
  s.st.name = s.opt.name;
  s.sink_dead.assign(s.opt.sinks.size(), false);
  self->set_exception_handler([self](std::exception_ptr& ep) { return on_exception(self, ep); });
  using st = job_state_data;
  return {
      [=](status_atom) -> caf::result<job_status> { return status_of(self->state); },
      [=](start_atom) {
        return command_then(self, command::start, [&](st&) { return start(self); });
      },
      [=](pause_atom) {
        return command_then(self, command::pause, [](st& s) -> expected<void> {
          s.pause_pending = true;
          return {};
        });
      },
      [=](pause_at_atom, const std::string& where) -> caf::result<job_status> {
        if (auto ok = breakpoint_allowed(self->state); !ok)
          return ok.error();
        auto bp = parse_breakpoint(where);
        if (!bp)
          return bp.error();
        self->state.breakpoints.push_back(std::move(*bp));
        refresh_attention(self->state);
        return status_of(self->state);
      },
      [=](resume_atom) {
        return command_then(self, command::resume, [&](st&) -> expected<void> {
          resume(self);
          return {};
        });
      },
      [=](cancel_atom, bool now) {
        return command_then(self, command::cancel, [&](st&) -> expected<void> {
          cancel(self, now);
          return {};
        });
      },
      [=](checkpoint_atom) {
        return command_then(self, command::checkpoint, [&](st&) -> expected<void> {
          checkpoint(self);
          return {};
        });
      },
      [=](update_atom, const std::string& key, const std::string& value) {
        return command_then(self, command::update, [&](st& s) { return update(s, key, value); });
      },
      [=](subscribe_atom, const caf::actor& sub, int64_t from) -> caf::result<int64_t> {
        return subscribe(self, sub, from);
      },
      [=](unsubscribe_atom, const caf::actor& sub) {
        auto& subs = self->state.subscribers;
        subs.erase(std::remove(subs.begin(), subs.end(), sub), subs.end());
      },
      [=](await_atom) -> caf::result<job_status> {
        auto& s = self->state;
        if (is_final(s.fsm.state()))
          return status_of(s);
        auto p = self->make_response_promise<job_status>();
        s.awaiting.push_back(p);
        return p;
      },
      [=](emit_atom, event& e) { publish(self, std::move(e.body)); },
      [=](boundary_atom, const boundary_point& p) { return on_boundary(self, p); },
      [=](prepared_atom) { move_to(self, job_state::running); },
      [=](driver_done_atom, const std::string& state, const std::string& error) {
        driver_done(self, state, error);
      },
  };
}

} // namespace

void driver_link::emit(event_body e) const {
  caf::anon_send(job_, emit_atom::value, event{0, 0, std::move(e)});
}

void driver_link::log(std::string level, std::string text) const {
  emit(log_line{std::move(level), std::move(text)});
}

void driver_link::prepared() const {
  caf::anon_send(job_, prepared_atom::value);
}

expected<boundary_reply> driver_link::boundary(caf::blocking_actor* self,
                                               const boundary_point& p) const {
  if (!attention_->load(std::memory_order_relaxed))
    return boundary_reply{};
  expected<boundary_reply> out = make_error(errc::internal, "no reply");
  // Unbounded on purpose: a paused job waits here until resume or cancel;
  // a job actor that dies fails the request at once.
  self->request(job_, caf::infinite, boundary_atom::value, p)
      .receive([&](boundary_reply& r) { out = std::move(r); },
               [&](caf::error& e) {
                 out = make_error(errc::unavailable, "job actor: " + caf::to_string(e));
               });
  return out;
}

job_actor spawn_job(caf::actor_system& sys, job_options options) {
  return sys.spawn(job_behavior, std::move(options));
}

expected<breakpoint> parse_breakpoint(const std::string& text) {
  auto bad = [&] {
    return make_error(errc::invalid_argument,
                      "breakpoint \"" + text + "\": expected STAGE:STEP[:PHASE], e.g. rl:2:reward");
  };
  auto a = text.find(':');
  if (a == std::string::npos || a == 0)
    return bad();
  auto b = text.find(':', a + 1);
  breakpoint bp;
  bp.stage = text.substr(0, a);
  auto step = text.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
  if (step.empty() || step.find_first_not_of("0123456789") != std::string::npos || step.size() > 12)
    return bad();
  bp.step = std::stoll(step);
  if (b != std::string::npos) {
    bp.phase = text.substr(b + 1);
    if (bp.phase.empty())
      return bad();
  }
  return bp;
}

} // namespace troupe::actors::job
