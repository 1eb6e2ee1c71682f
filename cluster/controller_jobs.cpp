#include "cluster/controller_impl.hpp"

#include "actors/rl/placement.hpp"

#include <caf/io/all.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>

namespace troupe::cluster {

// Whether `pid` is a `troupe driver` of `job_dir` (pids are reused).
bool is_driver_of(int64_t pid, const std::string& job_dir) {
  if (pid <= 0 || ::kill(static_cast<pid_t>(pid), 0) != 0)
    return false;
  // (/proc files report size 0: read to the end, not by size.)
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  if (!in)
    return false;
  auto cmdline = std::make_optional(std::string{std::istreambuf_iterator<char>(in), {}});
  std::vector<std::string> args;
  size_t start = 0;
  for (size_t i = 0; i <= cmdline->size(); ++i)
    if (i == cmdline->size() || (*cmdline)[i] == '\0') {
      args.push_back(cmdline->substr(start, i - start));
      start = i + 1;
    }
  bool driver = std::find(args.begin(), args.end(), "driver") != args.end();
  bool dir = std::find(args.begin(), args.end(), job_dir) != args.end();
  return driver && dir;
}

// ---- the supervisor's work (mu held) ----

// Cores a job takes on this machine: its driver only, when its workers
// run on nodes.
int64_t controller::impl::local_cores(const job_entry& e) const {
  return e.on_nodes ? 1 : std::min(e.rec.cores, adm.cores_total());
}

std::vector<running_job> controller::impl::running_jobs() const {
  std::vector<running_job> out;
  for (const auto& [id, e] : jobs)
    if (e->driver_alive)
      out.push_back({local_cores(*e), e->on_nodes ? e->nodes : std::vector<std::string>{},
                     e->on_nodes ? e->node_need : std::vector<int64_t>{}});
  return out;
}

// What admission needs to know of a queued job (its plan's nodes, once).
admission_request controller::impl::request_of(job_entry& e) {
  if (e.cfg && !e.need_known) {
    auto plan = actors::rl::make_plan(*e.cfg);
    if (plan && plan->uses_workers())
      e.node_need = plan->devices_per_node();
    e.need_known = true;
  }
  admission_request r{e.rec.id, e.rec.cores, e.node_need, actors::rl::launcher_kind::local};
  if (e.cfg)
    r.launcher = e.cfg->resources.launcher;
  return r;
}

// Starts queued jobs in order while admission says they fit.
void controller::impl::admit() {
  while (accepting && !adm.queue().empty()) {
    auto id = adm.queue().front();
    auto e = find(id);
    if (!e || e->state() != ctl_state::queued) {
      adm.remove(id);
      continue;
    }
    auto d = adm.decide(request_of(*e), running_jobs(), nodes->list());
    if (!d.start) {
      e->wait_reason = d.wait_reason;
      break;
    }
    if (d.on_nodes && !write_nodes(*e, d.nodes))
      break;
    e->on_nodes = d.on_nodes;
    e->nodes = d.nodes;
    e->workers_sent = false;
    e->wait_reason.clear();
    adm.remove(id);
    start_driver(*e);
  }
}

// nodes.json for the driver: where its workers run.
bool controller::impl::write_nodes(job_entry& e, const std::vector<std::string>& picked) {
  job_nodes jn;
  jn.bind_host = opt.advertise;
  auto ready = nodes->list();
  for (const auto& name : picked)
    for (const auto& n : ready)
      if (n.name == name)
        jn.nodes.push_back({n.name, n.address});
  if (auto ok = write_job_nodes(e.rec.job_dir, jn); !ok) {
    e.wait_reason = "cannot write " + std::string{nodes_file} + ": " + describe(ok.error());
    return false;
  }
  return true;
}

// The driver asked for its workers (workers.json): a StartWorker per
// worker for its node's agent, or the reason the job cannot have them.
std::optional<std::string> controller::impl::request_workers(job_entry& e, const worker_request_file& w) {
  e.workers_sent = true;
  if (w.pid != e.rec.driver_pid)
    return "the driver link spoke for pid " + std::to_string(w.pid) + ", not the job's driver " +
           std::to_string(e.rec.driver_pid);
  if (auto ok = check_worker_requests(w); !ok)
    return "the driver's workers: " + describe(ok.error());
  std::vector<int64_t> count(e.nodes.size(), 0);
  for (const auto& x : w.workers) {
    if (x.node < 0 || static_cast<size_t>(x.node) >= e.nodes.size())
      return "the driver asked for worker " + std::to_string(x.rank) + " on node " + std::to_string(x.node) +
             " of " + std::to_string(e.nodes.size());
    if (++count[static_cast<size_t>(x.node)] > e.node_need[static_cast<size_t>(x.node)])
      return "the driver asked for more workers on node " + e.nodes[static_cast<size_t>(x.node)] +
             " than the plan placed there";
  }
  for (const auto& x : w.workers) {
    worker_start s{e.rec.id, x.rank, static_cast<int32_t>(w.workers.size()), x.label, w.driver, w.cwd,
                   w.timeout_ms};
    if (auto ok = check_worker_start(s); !ok)
      return "worker " + std::to_string(x.rank) + ": " + describe(ok.error());
    outbox.emplace_back(e.nodes[static_cast<size_t>(x.node)], s);
  }
  e.asked = w;
  return std::nullopt;
}

// Ends the job with `reason` now: the controller's own verdict (a node
// lost, a worker that could not start), recorded before its driver is
// killed so that the driver's end reports it.
void controller::impl::fail_job(job_entry& e, const std::string& reason) {
  if (!e.driver_alive || is_final(e.state()))
    return;
  e.verdict = reason;
  e.rec.error = reason;
  if (e.proc)
    e.proc->kill(SIGKILL);
  else
    (void)::kill(static_cast<pid_t>(e.rec.driver_pid), SIGKILL);
}

// What the job was doing on node `node` when it was lost.
std::string controller::impl::loss_reason(const job_entry& e, const node_view& n) const {
  std::string ranks;
  for (const auto& r : e.roles)
    if (r.node == n.name && r.stage == e.status.stage && r.status != "failed")
      ranks += (ranks.empty() ? "" : ", ") + r.role + (r.rank > 0 ? "[dp " + std::to_string(r.rank) + "]" : "") +
               " (" + r.process + ")";
  // The phase under way, or the last one done (between phases).
  std::string where = "while the job started";
  for (auto it = e.events.rbegin(); it != e.events.rend(); ++it) {
    if (const auto* p = std::get_if<j::phase_started>(&it->body)) {
      where = "in stage " + p->stage + ", step " + std::to_string(p->iteration) + ", phase " + p->phase;
      break;
    }
    if (const auto* p = std::get_if<j::phase_finished>(&it->body)) {
      where = "in stage " + p->stage + ", step " + std::to_string(p->iteration) + ", after phase " + p->phase;
      break;
    }
  }
  return "node " + n.name + " (" + n.address + ") was lost (" + n.reason + ") " + where +
         "; its ranks: " + (ranks.empty() ? "none yet" : ranks);
}

// A node lost while the job ran there: the controller fails the job, or,
// when the driver failed it first (a collective with a rank on that node
// broke), says in its error what happened to the node.
void controller::impl::on_node_lost(job_entry& e, const node_view& n) {
  if (!e.on_nodes || std::find(e.nodes.begin(), e.nodes.end(), n.name) == e.nodes.end())
    return;
  bool just_failed = e.state() == ctl_state::failed && (e.driver_alive || now_us() - e.rec.end_time_us < 30'000'000);
  if (!just_failed && e.driver_alive && recoverable_on(e, n.name)) {
    std::fprintf(stderr, "troupe controller: job %s: %s; its driver restarts them\n",
                 e.rec.id.c_str(), loss_reason(e, n).c_str());
    return;
  }
  if (!just_failed)
    return fail_job(e, loss_reason(e, n));
  if (!e.verdict.empty())
    return;
  e.verdict = loss_reason(e, n);
  e.rec.error = e.verdict + "; the job failed with: " + e.rec.error;
  persist(e);
}

// Lost nodes and worker exits the registry reported.
void controller::impl::handle_node_news() {
  for (const auto& n : std::exchange(lost_nodes, {}))
    for (auto& [id, e] : jobs)
      on_node_lost(*e, n);
  for (const auto& [node, x] : std::exchange(worker_exits, {})) {
    auto e = find(x.job_id);
    if (!e || !e->on_nodes)
      continue;
    bool ours = std::find(e->nodes.begin(), e->nodes.end(), node) != e->nodes.end();
    if (ours && x.pid == 0) // it never ran
      fail_job(*e, "node " + node + ": worker " + std::to_string(x.rank) + " " + x.description);
    else if (ours && (x.code != 0 || x.signal != 0) && e->driver_alive)
      std::fprintf(stderr, "troupe controller: job %s: worker %d on node %s %s%s%s\n", x.job_id.c_str(), x.rank,
                   node.c_str(), x.description.c_str(), x.output_tail.empty() ? "" : "; its output ends: ",
                   x.output_tail.c_str());
  }
}

void controller::impl::start_driver(job_entry& e) {
  std::error_code ec;
  fs::remove(fs::path{e.rec.job_dir} / driver_info_file, ec);
  process_spec spec;
  spec.name = "driver of " + e.rec.id;
  spec.argv = {opt.executable, "driver", "--job-dir", e.rec.job_dir};
  if (e.rec.resume)
    spec.argv.push_back("--resume");
  if (e.on_nodes)
    spec.argv.push_back("--nodes");
  spec.output_path = (fs::path{e.rec.job_dir} / "driver.log").string();
  spec.detached = true;
  auto p = local_process::spawn(spec);
  auto t = now_us();
  if (!p) {
    e.rec.exit_reason = describe(p.error());
    set_state(e, ctl_state::failed, "cannot start the driver: " + describe(p.error()), t);
    finalize(e);
    return;
  }
  e.rec.driver_pid = p->pid();
  e.rec.start_time_us = t;
  e.rec.exit_reason.clear();
  e.proc = std::move(*p);
  e.driver_alive = true;
  e.attach_deadline_us = t + static_cast<int64_t>(opt.driver_start_timeout_s * 1e6);
  watch_driver(e);
  set_state(e, ctl_state::pending, e.rec.resume ? "admitted (resuming)" : "admitted", t);
}

// Drivers that ended, and drivers whose job actor is ready to attach.
void controller::impl::poll_drivers(std::vector<std::pair<std::string, driver_info>>& to_attach,
                  std::vector<std::function<void()>>& wake) {
  for (auto& [id, ep] : jobs) {
    auto& e = *ep;
    if (!e.driver_alive)
      continue;
    std::optional<std::string> ended;
    if (e.proc) {
      if (auto st = e.proc->poll())
        ended = "driver " + st->describe();
    } else if (!is_driver_of(e.rec.driver_pid, e.rec.job_dir)) {
      ended = "driver process ended";
    }
    if (ended) {
      on_driver_exit(e, *ended);
      auto w = take_waiters(e);
      wake.insert(wake.end(), w.begin(), w.end());
      continue;
    }
    if (e.attach_deadline_us > 0 && !e.attaching && now_us() >= e.attach_retry_us) {
      auto info = read_driver_info(e.rec.job_dir);
      if (info && info->pid == e.rec.driver_pid) {
        e.attaching = true;
        to_attach.emplace_back(id, *info);
        continue;
      }
      e.attach_retry_us = 0; // nothing to try until driver.json comes (news)
      if (now_us() > e.attach_deadline_us) {
        e.proc ? e.proc->kill(SIGKILL) : (void)::kill(static_cast<pid_t>(e.rec.driver_pid), SIGKILL);
        e.rec.error = "the driver did not publish its job within " +
                      std::to_string(opt.driver_start_timeout_s) + " s";
        e.attach_deadline_us = 0;
      }
    }
  }
}

void controller::impl::on_driver_exit(job_entry& e, const std::string& how) {
  unwatch_driver(e);
  e.driver_alive = false;
  e.attach_deadline_us = 0;
  e.proc.reset();
  e.replacements.clear();
  e.front = caf::actor{};
  // Whatever is left of it on its nodes ends there too.
  if (e.on_nodes)
    for (const auto& n : e.nodes)
      outbox.emplace_back(n, job_stop{e.rec.id, "its driver " + how});
  e.rec.exit_reason = how;
  catch_up(e);
  if (!is_final(e.state())) {
    auto log = tail_of_file((fs::path{e.rec.job_dir} / "driver.log").string(), 600);
    std::string reason = e.rec.error.empty() ? how : e.rec.error + " (" + how + ")";
    if (!log.empty())
      reason += "; the end of its log: " + log;
    e.rec.error = reason;
    set_state(e, ctl_state::failed, reason, now_us());
  }
  finalize(e);
}

void controller::impl::supervise() {
  std::unique_lock lock{mu};
  while (!stopping) {
    ++rounds;
    std::vector<std::pair<std::string, driver_info>> to_attach;
    std::vector<std::function<void()>> wake;
    handle_node_news();
    for (auto& [id, e] : jobs)
      place_replacements(*e); // a node may have joined
    poll_drivers(to_attach, wake);
    admit();
    auto sends = std::exchange(outbox, {});
    auto moves = std::exchange(replacement_sends, {});
    if (!to_attach.empty() || !wake.empty() || !sends.empty() || !moves.empty()) {
      lock.unlock();
      for (auto& w : wake)
        w();
      for (auto& [id, info] : to_attach)
        attach(id, info);
      send_to_agents(sends);
      send_replacements(moves);
      lock.lock();
      continue;
    }
    // NOTE [supervision by events]: until news or the next deadline.
    if (auto at = next_deadline_us())
      cv.wait_for(lock, std::chrono::microseconds(std::max<int64_t>(*at - now_us(), 0) + 1000));
    else
      cv.wait(lock);
  }
  auto sends = std::exchange(outbox, {});
  lock.unlock();
  send_to_agents(sends);
}

std::optional<int64_t> controller::impl::next_deadline_us() const {
  std::optional<int64_t> at;
  for (const auto& [id, e] : jobs)
    if (e->driver_alive && e->attach_deadline_us > 0 && !e->attaching) {
      // Its deadline, or sooner the next try of an attach that failed.
      auto t = e->attach_retry_us > 0 ? std::min(e->attach_retry_us, e->attach_deadline_us) : e->attach_deadline_us;
      at = at ? std::min(*at, t) : t;
    }
  return at;
}

void controller::impl::watch_driver(job_entry& e) {
  // Without the watch the supervisor would not hear of this driver's end:
  // the job fails rather than hang.
  auto ok = watch->watch_process(e.rec.driver_pid);
  if (ok)
    ok = watch->watch_folder(e.rec.job_dir);
  if (!ok)
    fail_job(e, "cannot watch the driver: " + describe(ok.error()));
}

void controller::impl::unwatch_driver(job_entry& e) {
  watch->forget_process(e.rec.driver_pid);
  watch->forget_folder(e.rec.job_dir);
}

// Without `mu`. A StartWorker its node cannot take fails the job (the
// next round: the node is lost, or gone).
void controller::impl::send_to_agents(const std::vector<std::pair<std::string, node_command>>& sends) {
  for (const auto& [node, c] : sends) {
    if (nodes->send(node, c) || !std::holds_alternative<worker_start>(c))
      continue;
    const auto& s = std::get<worker_start>(c);
    std::lock_guard lock{mu};
    worker_exits.push_back({node, worker_exit{s.job_id, s.rank, 0, -1, 0,
                                              "could not start: the node is not ready (lost or left)", ""}});
  }
}

namespace {

void deliver(const std::weak_ptr<controller::impl>& ctl, const std::string& id, const j::event& ev) {
  auto c = ctl.lock();
  if (!c)
    return;
  std::vector<std::function<void()>> wake;
  {
    std::lock_guard lock{c->mu};
    auto e = c->find(id);
    if (!e || !e->actor)
      return;
    if (ev.seq > e->rec.last_seq + 1)
      c->catch_up(*e); // a gap: the journal has what the feed missed
    if (ev.seq == e->rec.last_seq + 1)
      c->apply_event(*e, ev);
    wake = c->take_waiters(*e);
  }
  for (auto& w : wake)
    w();
}

// NOTE [replacing a worker]: each worker the driver wants again, for as
// long as the link lasts.
void ask_for_replacements(caf::event_based_actor* self, std::weak_ptr<controller::impl> ctl,
                          std::string id, caf::actor front) {
  self->request(front, caf::infinite, replace_worker_atom::value)
      .then(
          [=](const worker_entry& x) {
            if (auto c = ctl.lock())
              c->on_replace(id, x);
            ask_for_replacements(self, ctl, id, front);
          },
          [self](caf::error&) { self->quit(); });
}

} // namespace

caf::behavior driver_contact(caf::event_based_actor* self, std::weak_ptr<controller::impl> ctl,
                             std::string id, caf::actor front, bool on_nodes, int64_t from,
                             double timeout_s) {
  self->monitor(front);
  self->set_down_handler([self, ctl](caf::down_msg&) {
    if (auto c = ctl.lock())
      c->cv.notify_all(); // the supervisor sees the process end
    self->quit();
  });
  // No deadline of their own: NOTE [driver link].
  if (on_nodes)
    self->request(front, caf::infinite, workers_atom::value)
        .then(
            [=](const worker_request_file& w) {
              if (auto c = ctl.lock())
                c->on_workers(id, w);
              ask_for_replacements(self, ctl, id, front);
            },
            [self](caf::error&) { self->quit(); });
  self->request(front, caf::infinite, driver_job_atom::value)
      .then(
          [=](const caf::actor& job) {
            auto typed = caf::actor_cast<j::job_actor>(job);
            if (auto c = ctl.lock())
              c->on_job(id, typed);
            self->request(typed, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)),
                          j::subscribe_atom::value, caf::actor_cast<caf::actor>(self), from)
                .then([](int64_t) {}, [self](caf::error&) { self->quit(); });
          },
          [self](caf::error&) { self->quit(); });
  return {[ctl, id](const j::event& ev) { deliver(ctl, id, ev); }};
}

void controller::impl::attach(const std::string& id, const driver_info& info) {
  auto front = sys.middleman().remote_actor("127.0.0.1", info.port);
  std::lock_guard lock{mu};
  auto e = find(id);
  if (!e)
    return;
  e->attaching = false;
  if (!front) {
    // Still starting, or gone: the supervisor tries again shortly, until
    // the deadline (or the driver's end).
    e->attach_retry_us = now_us() + 100'000;
    cv.notify_all();
    return;
  }
  e->attach_deadline_us = 0;
  e->front = *front;
  e->feed = sys.spawn(driver_contact, weak_from_this(), id, *front, e->on_nodes,
                      e->rec.last_seq + 1, opt.command_timeout_s);
}

void controller::impl::on_workers(const std::string& id, const worker_request_file& w) {
  std::lock_guard lock{mu};
  auto e = find(id);
  if (!e || !e->driver_alive || !e->on_nodes)
    return;
  if (e->workers_sent) { // a driver attached again: its workers run
    if (!e->asked && w.pid == e->rec.driver_pid)
      e->asked = w;
    return;
  }
  if (auto refused = request_workers(*e, w))
    fail_job(*e, *refused);
  cv.notify_all(); // the supervisor sends the StartWorkers
}

void controller::impl::on_job(const std::string& id, const j::job_actor& job) {
  std::lock_guard lock{mu};
  if (auto e = find(id); e && e->driver_alive)
    e->actor = job;
}

} // namespace troupe::cluster
