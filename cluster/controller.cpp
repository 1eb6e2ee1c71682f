#include "cluster/controller_impl.hpp"

#include "actors/rl/settings.hpp"
#include "runtime/file_io.hpp"
#include "runtime/host.hpp"

#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>

#include <fcntl.h>
#include <malloc.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace troupe::cluster {

void count(job_totals& t, const j::event_body& b) {
  if (auto* w = std::get_if<j::weight_synced>(&b))
    ++t.weight_syncs, t.weight_sync_bytes += w->bytes, t.weight_sync_seconds += w->seconds;
  else if (auto* c = std::get_if<j::checkpoint_saved>(&b))
    ++t.checkpoints, t.checkpoint_bytes += c->bytes;
  else if (auto* r = std::get_if<j::role_changed>(&b);
           r && r->rank == 0 && r->status == "restarting")
    t.role_restarts[r->role] += 1;
}

// ---- driver.json ---------------------------------------------------------

expected<void> write_driver_info(const std::string& job_dir, const driver_info& d) {
  nlohmann::json j{{"pid", d.pid}, {"port", d.port}};
  return runtime::write_file_atomic((fs::path{job_dir} / driver_info_file).string(), j.dump());
}

expected<driver_info> read_driver_info(const std::string& job_dir) {
  auto path = (fs::path{job_dir} / driver_info_file).string();
  auto text = runtime::read_file(path);
  if (!text)
    return text.error();
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("pid") || !j.contains("port") ||
      !j["pid"].is_number_integer() || !j["port"].is_number_integer())
    return make_error(errc::parse_error, path + ": expected {\"pid\": N, \"port\": N}");
  auto port = j["port"].get<int64_t>();
  if (port <= 0 || port > 65535)
    return make_error(errc::parse_error, path + ": port " + std::to_string(port) + " out of range");
  return driver_info{j["pid"].get<int64_t>(), static_cast<uint16_t>(port)};
}

// ---- records, views and events (mu held) ----

controller::impl::~impl() {
  if (lock_fd >= 0)
    ::close(lock_fd);
}

void controller::impl::persist(job_entry& e) {
  e.rec.state = std::string{to_string(e.state())};
  e.rec.stage = e.status.stage;
  e.rec.iteration = e.status.iteration;
  e.rec.total = e.status.total;
  e.rec.last_seq = e.status.last_seq;
  (void)store->update(e.rec); // a failed write is not a reason to lose the job in memory
}

// Moves the job when the move is legal and not a replayed event's (NOTE
// [controller core]), and records it.
void controller::impl::set_state(job_entry& e, ctl_state s, const std::string& reason, int64_t time_us) {
  if (!e.book.move(s, time_us, reason))
    return;
  (void)store->add_transition(e.rec.id, {std::string{to_string(s)}, time_us, reason});
  if (s == ctl_state::paused)
    e.paused_since_us = time_us;
  else if (e.paused_since_us > 0)
    e.paused_us += time_us - e.paused_since_us, e.paused_since_us = 0;
  if (is_final(s)) {
    e.rec.end_time_us = time_us;
    if (s != ctl_state::succeeded && e.rec.error.empty())
      e.rec.error = reason;
  }
  persist(e);
}

job_view controller::impl::view_of(const job_entry& e) const {
  job_view v;
  v.state = e.state();
  v.status = e.status;
  v.status.id = e.rec.id;
  v.status.name = e.rec.name;
  v.status.start_time_us = e.rec.start_time_us;
  v.status.error = e.rec.error;
  v.status.last_seq = e.rec.last_seq;
  if (v.status.stage.empty())
    v.status.stage = e.rec.stage, v.status.iteration = e.rec.iteration,
    v.status.total = e.rec.total;
  v.status.eta_s = eta_of(e);
  v.submit_time_us = e.rec.submit_time_us;
  v.end_time_us = e.rec.end_time_us;
  v.run_dir = e.rec.run_dir;
  v.driver_pid = e.rec.driver_pid;
  v.exit_reason = e.rec.exit_reason;
  v.resumable = e.rec.resumable && (e.state() == ctl_state::lost || e.state() == ctl_state::failed ||
                                    e.state() == ctl_state::cancelled);
  if (e.state() == ctl_state::queued) {
    v.queue_position = static_cast<int32_t>(adm.position(e.rec.id));
  }
  v.transitions = e.book.transitions();
  v.roles = e.roles;
  v.resolved_config = e.rec.resolved_config;
  v.totals = e.totals;
  if (e.cfg)
    v.stages = e.cfg->stages;
  v.nodes = e.nodes;
  if (e.state() == ctl_state::queued || !e.replacements.empty())
    v.wait_reason = e.wait_reason;
  return v;
}

double controller::impl::eta_of(const job_entry& e) const {
  if (e.state() != ctl_state::running && e.state() != ctl_state::paused)
    return NAN;
  auto done = e.status.iteration - e.stage_from;
  if (done <= 0 || e.status.total < e.status.iteration)
    return NAN;
  auto paused = e.paused_us + (e.paused_since_us > 0 ? now_us() - e.paused_since_us : 0);
  double elapsed = static_cast<double>(now_us() - e.stage_start_us - paused) / 1e6;
  return elapsed / static_cast<double>(done) * static_cast<double>(e.status.total - e.status.iteration);
}

std::shared_ptr<job_entry> controller::impl::find(const std::string& id) {
  auto it = jobs.find(id);
  return it == jobs.end() ? nullptr : it->second;
}

caf::error controller::impl::unknown(const std::string& id) const {
  return make_error(errc::not_found, "no job '" + id + "'");
}

void controller::impl::apply_event(job_entry& e, const j::event& ev) {
  e.events.push_back(ev);
  e.status.last_seq = ev.seq;
  e.rec.last_seq = ev.seq;
  j::track(e.status, ev.body);
  count(e.totals, ev.body);
  std::visit([&](const auto& b) { on_body(e, ev, b); }, ev.body);
}

void controller::impl::on_body(job_entry& e, const j::event& ev, const j::stage_started& b) {
  e.stage_start_us = ev.time_us, e.stage_from = b.from_step, e.paused_us = 0;
}

void controller::impl::on_body(job_entry& e, const j::event&, const j::stage_finished& b) {
  if (!b.stopped)
    e.rec.resumable = true;
}

void controller::impl::on_body(job_entry& e, const j::event&, const j::role_changed& b) {
  auto it = std::find_if(e.roles.begin(), e.roles.end(), [&](const j::role_changed& r) {
    return r.stage == b.stage && r.role == b.role && r.rank == b.rank;
  });
  if (it == e.roles.end())
    e.roles.push_back(b);
  else
    *it = b;
}

void controller::impl::on_body(job_entry& e, const j::event&, const j::setting_updated& b) {
  if (!e.cfg)
    return;
  if (auto c = actors::rl::with_setting(*e.cfg, b.key, b.value))
    e.cfg = std::make_shared<actors::rl::job_config>(std::move(*c));
}

void controller::impl::on_body(job_entry& e, const j::event& ev, const j::state_changed& b) {
  if (b.to == j::job_state::failed)
    e.rec.error = e.verdict.empty() ? b.reason : e.verdict + "; the job failed with: " + b.reason;
  set_state(e, ctl_state_of(b.to), b.reason, ev.time_us);
}

// The journal's events after the last one seen (a driver that ended, or
// a gap in the feed).
void controller::impl::catch_up(job_entry& e) {
  auto path = (fs::path{e.rec.run_dir} / "events.jsonl").string();
  auto text = runtime::read_file(path);
  if (!text)
    return;
  j::each_journal_event(*text, [&](const j::event& ev) {
    if (ev.seq == e.rec.last_seq + 1)
      apply_event(e, ev);
  });
}

// A job that reached a final state: records written, memory released.
void controller::impl::finalize(job_entry& e) {
  e.actor.reset();
  if (e.feed)
    caf::anon_send_exit(e.feed, caf::exit_reason::user_shutdown);
  e.feed = nullptr;
  persist(e);
  std::vector<j::event>{}.swap(e.events);
  e.status_loaded = false;
  e.status.last_metrics.clear();
}

// ---- commands ----

template <class... Ts>
void controller::impl::ask(std::shared_ptr<job_entry> e, j::job_actor actor, reply done, Ts... xs) {
  auto timeout = std::chrono::milliseconds(static_cast<int64_t>(opt.command_timeout_s * 1000));
  auto me = shared_from_this();
  sys.spawn([=](caf::event_based_actor* a) {
    a->request(actor, timeout, xs...)
        .then(
            [=](j::job_status& st) {
              job_view v;
              {
                std::lock_guard lock{me->mu};
                v = me->view_of(*e);
              }
              // The job actor's answer is newer than the events seen so far.
              auto keep_error = v.status.error;
              v.status = st;
              v.status.id = e->rec.id;
              v.status.name = e->rec.name;
              if (v.status.error.empty())
                v.status.error = keep_error;
              v.state = ctl_state_of(st.state);
              done(std::move(v));
            },
            [=](caf::error& err) { done(err); });
  });
}

template <class... Ts>
void controller::impl::forward(const std::string& id, std::string_view what, reply done, Ts... xs) {
  std::unique_lock lock{mu};
  auto e = find(id);
  if (!e)
    return lock.unlock(), done(unknown(id));
  auto actor = actor_for(*e, what);
  lock.unlock();
  if (!actor)
    return done(actor.error());
  ask(e, *actor, std::move(done), xs...);
}

expected<j::job_actor> controller::impl::actor_for(job_entry& e, std::string_view what) {
  if (is_final(e.state()))
    return make_error(errc::illegal_state, std::string{what} + ": job " + e.rec.id + " is " +
                                               std::string{to_string(e.state())} +
                                               " (a final state)");
  if (e.state() == ctl_state::queued)
    return make_error(errc::illegal_state,
                      std::string{what} + ": job " + e.rec.id + " is queued; it has not started");
  if (!e.actor)
    return make_error(errc::unavailable, std::string{what} + ": the driver of job " + e.rec.id +
                                             " is starting; try again in a moment");
  return *e.actor;
}

// ---- the public face -----------------------------------------------------

expected<std::unique_ptr<controller>> controller::open(caf::actor_system& sys, controller_options o) {
  std::error_code ec;
  fs::create_directories(o.state_dir, ec);
  if (ec)
    return make_error(errc::io_error, "state dir " + o.state_dir + ": " + ec.message());
  ::chmod(o.state_dir.c_str(), 0700);
  auto ctl = std::unique_ptr<controller>(new controller);
  auto d = std::make_shared<impl>(sys);
  d->opt = std::move(o);
  d->opt.state_dir = fs::absolute(d->opt.state_dir).lexically_normal().string();
  // One controller per state directory.
  auto lock_path = (fs::path{d->opt.state_dir} / "controller.lock").string();
  d->lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (d->lock_fd < 0 || ::flock(d->lock_fd, LOCK_EX | LOCK_NB) != 0)
    return make_error(errc::unavailable, "state dir " + d->opt.state_dir +
                                             " is in use by another controller (" + lock_path + ")");
  d->jobs_root = (fs::path{d->opt.state_dir} / "jobs").string();
  fs::create_directories(d->jobs_root, ec);
  if (ec)
    return make_error(errc::io_error, "jobs root " + d->jobs_root + ": " + ec.message());
  auto hw = static_cast<int64_t>(std::thread::hardware_concurrency());
  d->adm.limit(d->opt.cores > 0 ? d->opt.cores : std::max<int64_t>(1, hw), d->opt.max_running_jobs);
  auto store = job_store::open((fs::path{d->opt.state_dir} / "jobs.db").string());
  if (!store)
    return store.error();
  d->store = std::move(*store);
  d->nodes = std::make_unique<node_registry>(d->opt.nodes);
  if (d->opt.advertise.empty())
    d->opt.advertise = runtime::host_name();
  // The registry's listeners run on an agent's stream (its lock held) or
  // the sweeper: they leave the news for the supervisor.
  std::weak_ptr<impl> weak = d;
  d->nodes->on_lost([weak](const node_view& v) {
    if (auto c = weak.lock()) {
      std::lock_guard lock{c->mu};
      c->lost_nodes.push_back(v);
      c->cv.notify_all();
    }
  });
  // A node that joins may let the head of the queue start.
  d->nodes->on_joined([weak](const node_view&) {
    if (auto c = weak.lock()) {
      std::lock_guard lock{c->mu};
      c->cv.notify_all();
    }
  });
  d->nodes->on_worker_exit([weak](const std::string& node, const worker_exit& x) {
    if (auto c = weak.lock()) {
      std::lock_guard lock{c->mu};
      c->worker_exits.emplace_back(node, x);
      c->cv.notify_all();
    }
  });
  d->watch = std::make_unique<process_watch>([c = d.get()] {
    std::lock_guard lock{c->mu};
    c->cv.notify_all();
  });
  if (auto ok = d->load_records(); !ok)
    return ok.error();
  d->supervisor = std::thread{[d] { d->supervise(); }};
  ctl->impl_ = d;
  return ctl;
}

controller::~controller() {
  shutdown();
}

const controller_options& controller::options() const {
  return impl_->opt;
}

job_store& controller::store() {
  return *impl_->store;
}

int64_t controller::supervisor_rounds() const {
  return impl_->rounds.load();
}

node_registry& controller::nodes() {
  return *impl_->nodes;
}

expected<job_view> controller::submit(const submit_request& r) {
  auto& d = *impl_;
  {
    std::lock_guard lock{d.mu};
    if (!d.accepting)
      return make_error(errc::unavailable, "the controller is shutting down");
  }
  std::shared_ptr<actors::rl::job_config> cfg;
  auto rec = d.validate(r, cfg);
  if (!rec)
    return rec.error();
  std::error_code ec;
  fs::create_directories(rec->job_dir, ec);
  if (ec)
    return make_error(errc::io_error, "job dir " + rec->job_dir + ": " + ec.message());
  ::chmod(rec->job_dir.c_str(), 0700);
  auto spec_path = (fs::path{rec->job_dir} / driver_spec_file).string();
  if (auto ok = runtime::write_file_atomic(spec_path, rec->resolved_config); !ok)
    return ok.error();
  if (auto ok = d.store->insert(*rec); !ok)
    return ok.error();
  auto e = std::make_shared<job_entry>();
  e->rec = std::move(*rec);
  e->cfg = std::move(cfg);
  std::lock_guard lock{d.mu};
  e->book.restore(ctl_state::queued, {{ctl_state::queued, e->rec.submit_time_us, "submitted"}});
  (void)d.store->add_transition(e->rec.id, {"queued", e->rec.submit_time_us, "submitted"});
  d.jobs[e->rec.id] = e;
  d.adm.enqueue(e->rec.id);
  d.cv.notify_all();
  return d.view_of(*e);
}

std::vector<job_view> controller::list(const std::vector<ctl_state>& states, int64_t limit) {
  auto& d = *impl_;
  std::lock_guard lock{d.mu};
  std::vector<std::shared_ptr<job_entry>> all;
  for (auto& [id, e] : d.jobs)
    if (states.empty() || std::find(states.begin(), states.end(), e->state()) != states.end())
      all.push_back(e);
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) {
    return a->rec.submit_time_us != b->rec.submit_time_us ? a->rec.submit_time_us > b->rec.submit_time_us
                                                          : a->rec.id > b->rec.id;
  });
  if (limit > 0 && static_cast<int64_t>(all.size()) > limit)
    all.resize(static_cast<size_t>(limit));
  std::vector<job_view> out;
  out.reserve(all.size());
  for (auto& e : all) {
    auto v = d.view_of(*e);
    v.resolved_config.clear(); // listings stay small
    v.transitions.clear();
    out.push_back(std::move(v));
  }
  return out;
}

expected<job_view> controller::get(const std::string& id) {
  auto& d = *impl_;
  std::lock_guard lock{d.mu};
  auto e = d.find(id);
  if (!e)
    return d.unknown(id);
  if (is_final(e->state()) && !e->status_loaded)
    d.load_journal_status(*e);
  return d.view_of(*e);
}

void controller::cancel(const std::string& id, bool now, reply done) {
  auto& d = *impl_;
  std::unique_lock lock{d.mu};
  auto e = d.find(id);
  if (!e)
    return lock.unlock(), done(d.unknown(id));
  if (e->state() == ctl_state::queued) {
    d.adm.remove(id);
    d.set_state(*e, ctl_state::cancelled, "cancelled while queued", now_us());
    d.finalize(*e);
    d.cv.notify_all(); // the next in the queue may start now
    auto v = d.view_of(*e);
    auto wake = d.take_waiters(*e);
    lock.unlock();
    for (auto& w : wake)
      w();
    return done(v);
  }
  if (!is_final(e->state()) && !e->actor && e->driver_alive) {
    // The driver is starting: its signal watcher cancels the job it spawns
    // (NOTE [stop signals]: SIGTERM = now, SIGINT = with a checkpoint).
    if (e->proc)
      e->proc->kill(now ? SIGTERM : SIGINT);
    auto v = d.view_of(*e);
    lock.unlock();
    return done(v);
  }
  lock.unlock();
  // NOTE [replacing a worker]: a job waiting for a node is blocked in a
  // restart: once its job actor holds the cancel, the wait ends so.
  auto then = [impl = impl_, id, done = std::move(done)](expected<job_view> v) {
    if (v)
      impl->give_up_replacements(id, "the job was cancelled while it waited for a node");
    done(std::move(v));
  };
  d.forward(id, "cancel", std::move(then), j::cancel_atom::value, now);
}

void controller::pause(const std::string& id, reply done) {
  impl_->forward(id, "pause", std::move(done), j::pause_atom::value);
}

void controller::checkpoint(const std::string& id, reply done) {
  impl_->forward(id, "checkpoint", std::move(done), j::checkpoint_atom::value);
}

void controller::resume(const std::string& id, reply done) {
  auto& d = *impl_;
  std::unique_lock lock{d.mu};
  auto e = d.find(id);
  if (!e)
    return lock.unlock(), done(d.unknown(id));
  bool restartable = e->state() == ctl_state::lost || e->state() == ctl_state::failed ||
                     e->state() == ctl_state::cancelled;
  if (restartable) {
    if (!e->rec.resumable) {
      lock.unlock();
      return done(make_error(errc::illegal_state,
                             "resume: job " + id + " is " + std::string{to_string(e->state())} +
                                 " and left no checkpoint to continue from"));
    }
    if (!d.accepting) {
      lock.unlock();
      return done(make_error(errc::unavailable, "the controller is shutting down"));
    }
    // Queued again; its next driver continues from the checkpoints, and the
    // in-memory history is the journal so far.
    e->rec.resume = true;
    e->rec.error.clear();
    e->rec.end_time_us = 0;
    e->rec.last_seq = 0;
    e->status = {};
    d.catch_up(*e);
    d.set_state(*e, ctl_state::queued, "resumed from its last checkpoint", now_us());
    d.adm.enqueue(id);
    d.cv.notify_all();
    auto v = d.view_of(*e);
    lock.unlock();
    return done(v);
  }
  lock.unlock();
  d.forward(id, "resume", std::move(done), j::resume_atom::value);
}

void controller::update(const std::string& id,
                        std::vector<std::pair<std::string, std::string>> settings, reply done) {
  auto& d = *impl_;
  std::unique_lock lock{d.mu};
  auto e = d.find(id);
  if (!e)
    return lock.unlock(), done(d.unknown(id));
  if (settings.empty() || static_cast<int64_t>(settings.size()) > d.opt.limits.settings) {
    lock.unlock();
    return done(make_error(errc::invalid_argument,
                           "settings: give 1 to " + std::to_string(d.opt.limits.settings) +
                               " key=value pairs (" + std::to_string(settings.size()) + " given)"));
  }
  auto actor = d.actor_for(*e, "update");
  // Every setting is checked before any is sent: all or none.
  auto cfg = e->cfg;
  lock.unlock();
  if (!actor)
    return done(actor.error());
  if (cfg) {
    auto c = *cfg;
    for (const auto& [k, v] : settings) {
      auto next = actors::rl::with_setting(c, k, v);
      if (!next)
        return done(next.error());
      c = std::move(*next);
    }
  }
  // One after another; the last answer is the reply.
  auto rest = std::make_shared<std::vector<std::pair<std::string, std::string>>>(std::move(settings));
  auto step = std::make_shared<std::function<void(expected<job_view>)>>();
  auto self = impl_;
  *step = [self, e, a = *actor, rest, step, done](expected<job_view> r) {
    if (!r || rest->empty()) {
      auto d2 = std::move(done);
      *step = nullptr; // break the cycle
      return d2(std::move(r));
    }
    auto [k, v] = rest->front();
    rest->erase(rest->begin());
    self->ask(e, a, *step, j::update_atom::value, k, v);
  };
  auto [k, v] = rest->front();
  rest->erase(rest->begin());
  d.ask(e, *actor, *step, j::update_atom::value, k, v);
}

// ---- shutdown ------------------------------------------------------------

expected<int64_t> each_event_so_far(controller& ctl, const std::string& id, int64_t from_seq,
                                    const std::function<void(const j::event&)>& each) {
  auto cur = ctl.watch(id, from_seq, [] {});
  if (!cur)
    return cur.error();
  int64_t next = std::max<int64_t>(from_seq, 1);
  for (;;) {
    auto b = (*cur)->next(4096);
    for (const auto& e : b.events)
      each(e), next = e.seq + 1;
    if (b.final || b.events.empty())
      return next;
  }
}

void controller::shutdown() {
  if (!impl_)
    return;
  auto& d = *impl_;
  {
    std::lock_guard lock{d.mu};
    if (d.shut_down)
      return;
    d.shut_down = true;
    d.accepting = false;
  }
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(d.opt.shutdown_timeout_s * 1000));
  if (d.opt.on_shutdown == shutdown_policy::checkpoint) {
    std::vector<std::string> ids;
    {
      std::lock_guard lock{d.mu};
      for (auto& [id, e] : d.jobs)
        if (e->driver_alive)
          ids.push_back(id);
    }
    for (auto& id : ids)
      cancel(id, false, [](expected<job_view>) {});
  }
  if (d.opt.on_shutdown != shutdown_policy::detach) {
    std::unique_lock lock{d.mu};
    while (!d.running_jobs().empty() && std::chrono::steady_clock::now() < deadline)
      d.cv.wait_for(lock, std::chrono::milliseconds(50));
  }
  {
    std::lock_guard lock{d.mu};
    d.stopping = true;
    d.cv.notify_all();
  }
  if (d.supervisor.joinable())
    d.supervisor.join();
  std::lock_guard lock{d.mu};
  for (auto& [id, e] : d.jobs) {
    if (e->feed)
      caf::anon_send_exit(e->feed, caf::exit_reason::user_shutdown);
    e->feed = nullptr;
    e->actor.reset();
    if (e->proc)
      e->proc->release(); // drivers outlive the controller (NOTE [controller restart])
    e->proc.reset();
    std::vector<std::function<void()>> w;
    w.swap(e->waiters);
  }
  ::malloc_trim(0);
}

} // namespace troupe::cluster
