#include "cluster/controller.hpp"
#include "cluster/controller_core.hpp"

#include "actors/rl/job_config.hpp"
#include "actors/rl/placement.hpp"
#include "actors/rl/settings.hpp"
#include "cluster/job_store.hpp"
#include "cluster/job_nodes.hpp"
#include "cluster/local_launcher.hpp"
#include "cluster/node_placement.hpp"
#include "runtime/config.hpp"
#include "runtime/file_io.hpp"
#include "runtime/host.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <limits>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include <fcntl.h>
#include <malloc.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace troupe::cluster {

namespace j = actors::job;
namespace fs = std::filesystem;

void count(job_totals& t, const j::event_body& b) {
  if (auto* w = std::get_if<j::weight_synced>(&b))
    ++t.weight_syncs, t.weight_sync_bytes += w->bytes, t.weight_sync_seconds += w->seconds;
  else if (auto* c = std::get_if<j::checkpoint_saved>(&b))
    ++t.checkpoints, t.checkpoint_bytes += c->bytes;
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

// ---- one job -------------------------------------------------------------

namespace {

int64_t now_us() {
  return j::now_us();
}

// The controller's knowledge of one job. Guarded by controller::impl::mu.
struct job_entry {
  job_record rec;
  /// Its state and moves (NOTE [controller core]).
  job_book book;
  ctl_state state() const { return book.state(); }
  j::job_status status;
  std::vector<j::role_changed> roles;
  /// Every event of the journal so far, while the job is not final (the
  /// events of a final job are read from its journal when asked for).
  std::vector<j::event> events;
  job_totals totals;
  /// The config with every accepted runtime setting (checks UpdateJob).
  std::shared_ptr<actors::rl::job_config> cfg;
  /// Stage clock for the ETA (from the events' times).
  int64_t stage_start_us = 0;
  int64_t stage_from = 0;
  int64_t paused_us = 0;
  int64_t paused_since_us = 0;
  /// The driver: our child (proc), or one found running after a restart.
  std::optional<local_process> proc;
  bool driver_alive = false;
  /// Waiting for driver.json until this time (0 = not starting).
  int64_t attach_deadline_us = 0;
  bool attaching = false;
  std::optional<j::job_actor> actor;
  caf::actor feed;
  /// last_metrics etc. of a final job were folded from its journal.
  bool status_loaded = false;
  /// Cursors waiting for more events.
  std::vector<std::function<void()>> waiters;
  /// Workers on nodes (NOTE [remote workers]): decided at admission; the
  /// node of each node of the plan, the devices it holds there, and whether
  /// the workers were asked for.
  bool on_nodes = false;
  std::vector<std::string> nodes;
  std::vector<int64_t> node_need;
  bool need_known = false;
  bool workers_sent = false;
  std::string wait_reason;
  /// The controller's own reason for failing the job (a node lost), kept
  /// ahead of whatever the driver says.
  std::string verdict;
};

std::string random_id() {
  static std::mutex mu;
  static std::mt19937_64 gen{std::random_device{}()};
  std::lock_guard lock{mu};
  char buf[32];
  std::snprintf(buf, sizeof buf, "job-%010llx",
                static_cast<unsigned long long>(gen() & 0xffffffffffULL));
  return buf;
}

// Whether `p` (normalised) lies inside `root` (normalised, absolute).
bool inside(const fs::path& root, const fs::path& p) {
  auto r = root.lexically_normal();
  auto q = p.lexically_normal();
  auto rel = q.lexically_relative(r);
  return !rel.empty() && *rel.begin() != ".." && rel.is_relative();
}

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

} // namespace

// ---- the controller ------------------------------------------------------

struct controller::impl : std::enable_shared_from_this<impl> {
  explicit impl(caf::actor_system& s) : sys(s) {}

  caf::actor_system& sys;
  controller_options opt;
  std::unique_ptr<job_store> store;
  std::unique_ptr<node_registry> nodes;
  std::string jobs_root;
  int lock_fd = -1;

  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::shared_ptr<job_entry>> jobs;
  admission adm;
  bool accepting = true;
  bool stopping = false;
  bool shut_down = false;
  std::thread supervisor;
  /// From the node registry's listeners, for the supervisor (which alone
  /// talks to agents, never with `mu` held: an agent's stream calls the
  /// listeners with its own lock held).
  std::vector<node_view> lost_nodes;
  std::vector<std::pair<std::string, worker_exit>> worker_exits;
  /// Commands for agents, sent by the supervisor once `mu` is released.
  std::vector<std::pair<std::string, node_command>> outbox;

  ~impl() {
    if (lock_fd >= 0)
      ::close(lock_fd);
  }

  // ---- records and views (mu held) ----

  void persist(job_entry& e) {
    e.rec.state = std::string{to_string(e.state())};
    e.rec.stage = e.status.stage;
    e.rec.iteration = e.status.iteration;
    e.rec.total = e.status.total;
    e.rec.last_seq = e.status.last_seq;
    (void)store->update(e.rec); // a failed write is not a reason to lose the job in memory
  }

  // Moves the job when the move is legal and not a replayed event's (NOTE
  // [controller core]), and records it.
  void set_state(job_entry& e, ctl_state s, const std::string& reason, int64_t time_us) {
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

  job_view view_of(const job_entry& e) const {
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
    if (e.state() == ctl_state::queued)
      v.wait_reason = e.wait_reason;
    return v;
  }

  double eta_of(const job_entry& e) const {
    if (e.state() != ctl_state::running && e.state() != ctl_state::paused)
      return NAN;
    auto done = e.status.iteration - e.stage_from;
    if (done <= 0 || e.status.total < e.status.iteration)
      return NAN;
    auto paused = e.paused_us + (e.paused_since_us > 0 ? now_us() - e.paused_since_us : 0);
    double elapsed = static_cast<double>(now_us() - e.stage_start_us - paused) / 1e6;
    return elapsed / static_cast<double>(done) * static_cast<double>(e.status.total - e.status.iteration);
  }

  std::shared_ptr<job_entry> find(const std::string& id) {
    auto it = jobs.find(id);
    return it == jobs.end() ? nullptr : it->second;
  }

  caf::error unknown(const std::string& id) const {
    return make_error(errc::not_found, "no job '" + id + "'");
  }

  // ---- events (mu held) ----

  void apply_event(job_entry& e, const j::event& ev) {
    e.events.push_back(ev);
    e.status.last_seq = ev.seq;
    e.rec.last_seq = ev.seq;
    j::track(e.status, ev.body);
    count(e.totals, ev.body);
    std::visit([&](const auto& b) { on_body(e, ev, b); }, ev.body);
  }

  void on_body(job_entry& e, const j::event& ev, const j::stage_started& b) {
    e.stage_start_us = ev.time_us, e.stage_from = b.from_step, e.paused_us = 0;
  }
  void on_body(job_entry& e, const j::event&, const j::stage_finished& b) {
    if (!b.stopped)
      e.rec.resumable = true;
  }
  void on_body(job_entry& e, const j::event&, const j::checkpoint_saved&) { e.rec.resumable = true; }
  void on_body(job_entry& e, const j::event&, const j::role_changed& b) {
    auto it = std::find_if(e.roles.begin(), e.roles.end(), [&](const j::role_changed& r) {
      return r.stage == b.stage && r.role == b.role && r.rank == b.rank;
    });
    if (it == e.roles.end())
      e.roles.push_back(b);
    else
      *it = b;
  }
  void on_body(job_entry& e, const j::event&, const j::setting_updated& b) {
    if (!e.cfg)
      return;
    if (auto c = actors::rl::with_setting(*e.cfg, b.key, b.value))
      e.cfg = std::make_shared<actors::rl::job_config>(std::move(*c));
  }
  void on_body(job_entry& e, const j::event& ev, const j::state_changed& b) {
    if (b.to == j::job_state::failed)
      e.rec.error = e.verdict.empty() ? b.reason : e.verdict + "; the job failed with: " + b.reason;
    set_state(e, ctl_state_of(b.to), b.reason, ev.time_us);
  }
  template <class T>
  void on_body(job_entry&, const j::event&, const T&) {}

  std::vector<std::function<void()>> take_waiters(job_entry& e) {
    std::vector<std::function<void()>> out;
    out.swap(e.waiters);
    return out;
  }

  // The journal's events after the last one seen (a driver that ended, or
  // a gap in the feed).
  void catch_up(job_entry& e) {
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
  void finalize(job_entry& e) {
    e.actor.reset();
    if (e.feed)
      caf::anon_send_exit(e.feed, caf::exit_reason::user_shutdown);
    e.feed = nullptr;
    persist(e);
    std::vector<j::event>{}.swap(e.events);
    e.status_loaded = false;
    e.status.last_metrics.clear();
  }

  // ---- the supervisor's work (mu held) ----

  // Cores a job takes on this machine: its driver only, when its workers
  // run on nodes.
  int64_t local_cores(const job_entry& e) const {
    return e.on_nodes ? 1 : std::min(e.rec.cores, adm.cores_total());
  }

  std::vector<running_job> running_jobs() const {
    std::vector<running_job> out;
    for (const auto& [id, e] : jobs)
      if (e->driver_alive)
        out.push_back({local_cores(*e), e->on_nodes ? e->nodes : std::vector<std::string>{},
                       e->on_nodes ? e->node_need : std::vector<int64_t>{}});
    return out;
  }

  // What admission needs to know of a queued job (its plan's nodes, once).
  admission_request request_of(job_entry& e) {
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
  void admit() {
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

  // ---- jobs on nodes (mu held; NOTE [remote workers]) ----

  // nodes.json for the driver: where its workers run.
  bool write_nodes(job_entry& e, const std::vector<std::string>& picked) {
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
  std::optional<std::string> request_workers(job_entry& e) {
    auto w = read_worker_requests(e.rec.job_dir);
    if (!w || w->pid != e.rec.driver_pid)
      return std::nullopt; // not yet
    e.workers_sent = true;
    std::vector<int64_t> count(e.nodes.size(), 0);
    for (const auto& x : w->workers) {
      if (x.node < 0 || static_cast<size_t>(x.node) >= e.nodes.size())
        return "the driver asked for worker " + std::to_string(x.rank) + " on node " + std::to_string(x.node) +
               " of " + std::to_string(e.nodes.size());
      if (++count[static_cast<size_t>(x.node)] > e.node_need[static_cast<size_t>(x.node)])
        return "the driver asked for more workers on node " + e.nodes[static_cast<size_t>(x.node)] +
               " than the plan placed there";
    }
    for (const auto& x : w->workers) {
      worker_start s{e.rec.id, x.rank, static_cast<int32_t>(w->workers.size()), x.label, w->driver, w->cwd,
                     w->timeout_ms};
      if (auto ok = check_worker_start(s); !ok)
        return "worker " + std::to_string(x.rank) + ": " + describe(ok.error());
      outbox.emplace_back(e.nodes[static_cast<size_t>(x.node)], s);
    }
    return std::nullopt;
  }

  // Ends the job with `reason` now: the controller's own verdict (a node
  // lost, a worker that could not start), recorded before its driver is
  // killed so that the driver's end reports it.
  void fail_job(job_entry& e, const std::string& reason) {
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
  std::string loss_reason(const job_entry& e, const node_view& n) const {
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
  void on_node_lost(job_entry& e, const node_view& n) {
    if (!e.on_nodes || std::find(e.nodes.begin(), e.nodes.end(), n.name) == e.nodes.end())
      return;
    bool just_failed = e.state() == ctl_state::failed && (e.driver_alive || now_us() - e.rec.end_time_us < 30'000'000);
    if (!just_failed)
      return fail_job(e, loss_reason(e, n));
    if (!e.verdict.empty())
      return;
    e.verdict = loss_reason(e, n);
    e.rec.error = e.verdict + "; the job failed with: " + e.rec.error;
    persist(e);
  }

  // Lost nodes and worker exits the registry reported.
  void handle_node_news() {
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

  void start_driver(job_entry& e) {
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
    set_state(e, ctl_state::pending, e.rec.resume ? "admitted (resuming)" : "admitted", t);
  }

  // Drivers that ended, and drivers whose job actor is ready to attach.
  void poll_drivers(std::vector<std::pair<std::string, driver_info>>& to_attach,
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
      if (e.on_nodes && !e.workers_sent)
        if (auto refused = request_workers(e))
          fail_job(e, *refused);
      if (e.attach_deadline_us > 0 && !e.attaching) {
        auto info = read_driver_info(e.rec.job_dir);
        if (info && info->pid == e.rec.driver_pid) {
          e.attaching = true;
          to_attach.emplace_back(id, *info);
        } else if (now_us() > e.attach_deadline_us) {
          e.proc ? e.proc->kill(SIGKILL) : (void)::kill(static_cast<pid_t>(e.rec.driver_pid), SIGKILL);
          e.rec.error = "the driver did not publish its job within " +
                        std::to_string(opt.driver_start_timeout_s) + " s";
          e.attach_deadline_us = 0;
        }
      }
    }
  }

  void on_driver_exit(job_entry& e, const std::string& how) {
    e.driver_alive = false;
    e.attach_deadline_us = 0;
    e.proc.reset();
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

  void attach(const std::string& id, const driver_info& info);

  void supervise() {
    std::unique_lock lock{mu};
    while (!stopping) {
      std::vector<std::pair<std::string, driver_info>> to_attach;
      std::vector<std::function<void()>> wake;
      handle_node_news();
      poll_drivers(to_attach, wake);
      admit();
      auto sends = std::exchange(outbox, {});
      if (!to_attach.empty() || !wake.empty() || !sends.empty()) {
        lock.unlock();
        for (auto& w : wake)
          w();
        for (auto& [id, info] : to_attach)
          attach(id, info);
        send_to_agents(sends);
        lock.lock();
        continue;
      }
      cv.wait_for(lock, std::chrono::milliseconds(50));
    }
    auto sends = std::exchange(outbox, {});
    lock.unlock();
    send_to_agents(sends);
  }

  // Without `mu`. A StartWorker its node cannot take fails the job (the
  // next round: the node is lost, or gone).
  void send_to_agents(const std::vector<std::pair<std::string, node_command>>& sends) {
    for (const auto& [node, c] : sends) {
      if (nodes->send(node, c) || !std::holds_alternative<worker_start>(c))
        continue;
      const auto& s = std::get<worker_start>(c);
      std::lock_guard lock{mu};
      worker_exits.push_back({node, worker_exit{s.job_id, s.rank, 0, -1, 0,
                                                "could not start: the node is not ready (lost or left)", ""}});
    }
  }

  // ---- submit (no lock) ----

  expected<job_record> validate(const submit_request& r, std::shared_ptr<actors::rl::job_config>& cfg_out);

  // ---- commands ----

  template <class... Ts>
  void ask(std::shared_ptr<job_entry> e, j::job_actor actor, reply done, Ts... xs);
  /// A command for the job actor of `id`, or the reason it cannot take one.
  template <class... Ts>
  void forward(const std::string& id, std::string_view what, reply done, Ts... xs);
  expected<j::job_actor> actor_for(job_entry& e, std::string_view what);

  // ---- restart ----

  expected<void> load_records();
  void recover(job_entry& e);
  void reattach(job_entry& e);
  void load_journal_status(job_entry& e);
};

// The controller's end of a job's event stream: subscribes to the job actor
// (events from `from`), hands each event to the controller, and tells it
// when the driver's connection goes down.
caf::behavior event_feed(caf::event_based_actor* self, std::weak_ptr<controller::impl> ctl,
                         std::string id, j::job_actor job, int64_t from, double timeout_s);

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

} // namespace

caf::behavior event_feed(caf::event_based_actor* self, std::weak_ptr<controller::impl> ctl,
                         std::string id, j::job_actor job, int64_t from, double timeout_s) {
  self->monitor(job);
  self->set_down_handler([self, ctl](caf::down_msg&) {
    if (auto c = ctl.lock())
      c->cv.notify_all(); // the supervisor sees the process end
    self->quit();
  });
  self->request(job, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)),
                j::subscribe_atom::value, caf::actor_cast<caf::actor>(self), from)
      .then([](int64_t) {}, [self](caf::error&) { self->quit(); });
  return {[ctl, id](const j::event& ev) { deliver(ctl, id, ev); }};
}

void controller::impl::attach(const std::string& id, const driver_info& info) {
  auto actor = sys.middleman().remote_actor<j::job_actor>("127.0.0.1", info.port);
  std::lock_guard lock{mu};
  auto e = find(id);
  if (!e)
    return;
  e->attaching = false;
  if (!actor) {
    // Still starting, or gone: the supervisor retries until the deadline.
    return;
  }
  e->attach_deadline_us = 0;
  e->actor = *actor;
  e->feed = sys.spawn(event_feed, weak_from_this(), id, *actor, e->rec.last_seq + 1,
                      opt.command_timeout_s);
}

// ---- submit ----

expected<job_record> controller::impl::validate(const submit_request& r,
                                                std::shared_ptr<actors::rl::job_config>& cfg_out) {
  const auto& lim = opt.limits;
  int64_t bytes = static_cast<int64_t>(r.spec_text.size());
  for (const auto& [name, text] : r.bases)
    bytes += static_cast<int64_t>(text.size());
  if (bytes > lim.spec_bytes)
    return make_error(errc::out_of_range, "spec: " + std::to_string(bytes) +
                                              " bytes with its base files; the limit is " +
                                              std::to_string(lim.spec_bytes));
  if (static_cast<int64_t>(r.overrides.size()) > lim.overrides)
    return make_error(errc::out_of_range, "overrides: " + std::to_string(r.overrides.size()) +
                                              " given; the limit is " + std::to_string(lim.overrides));
  for (size_t i = 0; i < r.overrides.size(); ++i)
    if (static_cast<int64_t>(r.overrides[i].size()) > lim.override_bytes)
      return make_error(errc::out_of_range, "overrides[" + std::to_string(i) + "]: " +
                                                std::to_string(r.overrides[i].size()) +
                                                " bytes; the limit is " +
                                                std::to_string(lim.override_bytes));
  if (r.name.size() > 128 ||
      !std::all_of(r.name.begin(), r.name.end(), [](unsigned char c) {
        return std::isalnum(c) || c == '-' || c == '_' || c == '.';
      }))
    return make_error(errc::invalid_argument,
                      "name: '" + r.name.substr(0, 128) +
                          "' is not a name (letters, digits, '-', '_', '.'; at most 128)");
  auto spec_name = r.spec_name.empty() ? std::string{"spec.yaml"} : r.spec_name;
  std::vector<runtime::yaml_document::source_file> bases;
  for (const auto& [name, text] : r.bases)
    bases.push_back({name, text});
  auto doc = runtime::yaml_document::from_sources({spec_name, r.spec_text}, bases);
  if (!doc)
    return doc.error();
  for (const auto& o : r.overrides)
    if (auto ok = doc->set(o); !ok)
      return ok.error();
  auto cfg = runtime::load_config<actors::rl::job_config>(*doc);
  if (!cfg)
    return cfg.error();
  auto plan = actors::rl::make_plan(*cfg);
  if (!plan)
    return plan.error();

  job_record rec;
  rec.id = random_id();
  rec.job_dir = (fs::path{jobs_root} / rec.id).string();
  // NOTE: run directories stay under the jobs root: a relative run.dir is
  // the job's own folder's, an absolute one must lie inside the root.
  fs::path run_dir = cfg->run.dir;
  if (run_dir.is_relative())
    run_dir = fs::path{rec.job_dir} / run_dir;
  run_dir = run_dir.lexically_normal();
  if (!inside(fs::path{jobs_root}, run_dir) || (fs::path{cfg->run.dir}.is_relative() &&
                                                !inside(fs::path{rec.job_dir}, run_dir)))
    return make_error(errc::invalid_config,
                      spec_name + ": run.dir: '" + cfg->run.dir +
                          "' lies outside the controller's jobs root (a relative run.dir is "
                          "placed in the job's own folder)");
  cfg->run.dir = run_dir.string();
  cfg->run.progress = actors::rl::progress_style::none;
  int64_t per_process = cfg->run.threads > 0 ? cfg->run.threads : adm.cores_total();
  int64_t processes = std::max<int64_t>(1, static_cast<int64_t>(plan->devices.size()));
  rec.cores = std::min(adm.cores_total(), per_process * processes);
  rec.name = r.name.empty() ? cfg->run.name : r.name;
  rec.spec_name = spec_name;
  rec.spec_text = r.spec_text;
  rec.resolved_config = runtime::to_yaml(*cfg, false);
  rec.run_dir = cfg->run.dir;
  rec.submitter = r.submitter;
  rec.submit_time_us = now_us();
  rec.state = "queued";
  cfg_out = std::make_shared<actors::rl::job_config>(std::move(*cfg));
  return rec;
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

// ---- restart ----

namespace {

// The kind of a journal line, read without parsing it; "" when it is not
// there. The line's keys are in name order and those before "kind" hold
// numbers or plain strings, so the first `"kind":"` is the event's (inside
// a string its quotes would be escaped).
std::string_view kind_of_line(std::string_view line) {
  constexpr std::string_view key = "\"kind\":\"";
  auto at = line.find(key);
  if (at == std::string_view::npos)
    return {};
  auto from = at + key.size();
  auto end = line.find('"', from);
  return end == std::string_view::npos ? std::string_view{} : line.substr(from, end - from);
}

// What a final job's status and totals need from its journal: every
// stage, weight-sync and checkpoint event, and only the last metrics and
// phase events (each replaces the one before it in the status), in journal
// order. A 10,000-step journal holds 150,000 events; this parses a few
// hundred of them.
std::vector<std::string_view> status_lines(std::string_view text) {
  std::vector<std::string_view> keep;
  std::string_view last_metrics, last_phase;
  size_t start = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string_view::npos)
      break;
    auto line = text.substr(start, end - start);
    start = end + 1;
    auto kind = kind_of_line(line);
    if (kind == j::metrics_reported::kind)
      last_metrics = line;
    else if (kind == j::phase_started::kind || kind == j::phase_finished::kind)
      last_phase = line;
    else if (kind == j::stage_started::kind || kind == j::weight_synced::kind ||
             kind == j::checkpoint_saved::kind || kind.empty())
      keep.push_back(line);
  }
  for (auto line : {last_metrics, last_phase})
    if (!line.empty())
      keep.push_back(line);
  // Views into `text`: their addresses are their order in the journal.
  std::sort(keep.begin(), keep.end(), [](std::string_view a, std::string_view b) { return a.data() < b.data(); });
  return keep;
}

} // namespace

void controller::impl::load_journal_status(job_entry& e) {
  auto text = runtime::read_file((fs::path{e.rec.run_dir} / "events.jsonl").string());
  if (!text)
    return;
  e.totals = {};
  for (auto line : status_lines(*text))
    if (auto ev = j::event_from_json(line)) {
      j::track(e.status, ev->body);
      count(e.totals, ev->body);
    }
  e.status_loaded = true;
}

void controller::impl::recover(job_entry& e) {
  auto info = read_driver_info(e.rec.job_dir);
  std::optional<driver_info> found;
  if (info)
    found = *info;
  bool running = found && is_driver_of(found->pid, e.rec.job_dir);
  switch (plan_recovery(e.state(), e.rec.driver_pid, found, running)) {
  case recovery_step::keep:
    return;
  case recovery_step::requeue:
    adm.enqueue(e.rec.id);
    return;
  case recovery_step::reattach:
    return reattach(e);
  case recovery_step::settle:
    break;
  }
  catch_up(e);
  if (!is_final(e.state())) {
    e.rec.exit_reason = "the driver went away while the controller was down";
    set_state(e, ctl_state::lost, e.rec.exit_reason, now_us());
  }
  finalize(e);
}

// Re-attach: the feed subscribes from the first event (the job actor
// replays its journal, and the job book lets through only the moves newer
// than the last recorded), so the in-memory history starts over. A job on
// nodes holds its nodes' devices again (its workers were asked for).
void controller::impl::reattach(job_entry& e) {
  if (auto jn = read_job_nodes(e.rec.job_dir)) {
    e.on_nodes = true;
    for (const auto& n : jn->nodes)
      e.nodes.push_back(n.name);
    if (auto plan = e.cfg ? actors::rl::make_plan(*e.cfg) : make_error(errc::internal, "no config");
        plan && plan->nodes == static_cast<int64_t>(e.nodes.size()))
      e.node_need = plan->devices_per_node();
    e.node_need.resize(e.nodes.size(), 1);
    e.need_known = true;
    e.workers_sent = true;
  }
  e.driver_alive = true;
  e.rec.last_seq = 0;
  e.status = {};
  e.attach_deadline_us = now_us() + static_cast<int64_t>(opt.driver_start_timeout_s * 1e6);
}

expected<void> controller::impl::load_records() {
  auto recs = store->jobs();
  if (!recs)
    return recs.error();
  for (auto& rec : *recs) {
    auto e = std::make_shared<job_entry>();
    auto state = parse_ctl_state(rec.state);
    e->rec = std::move(rec);
    e->status.stage = e->rec.stage;
    e->status.iteration = e->rec.iteration;
    e->status.total = e->rec.total;
    std::vector<transition_view> history;
    if (auto ts = store->transitions(e->rec.id))
      for (auto& t : *ts)
        if (auto s = parse_ctl_state(t.state))
          history.push_back({*s, t.time_us, t.reason});
    e->book.restore(state ? *state : ctl_state::lost, std::move(history));
    if (auto doc = runtime::yaml_document::from_text(e->rec.resolved_config, e->rec.spec_name))
      if (auto cfg = runtime::load_config<actors::rl::job_config>(*doc))
        e->cfg = std::make_shared<actors::rl::job_config>(std::move(*cfg));
    if (!is_final(e->state()) && e->state() != ctl_state::queued)
      e->rec.last_seq = 0, e->status.last_seq = 0; // the journal is read again
    jobs[e->rec.id] = e;
    recover(*e);
  }
  return {};
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
  d->nodes->on_worker_exit([weak](const std::string& node, const worker_exit& x) {
    if (auto c = weak.lock()) {
      std::lock_guard lock{c->mu};
      c->worker_exits.emplace_back(node, x);
      c->cv.notify_all();
    }
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
  d.forward(id, "cancel", std::move(done), j::cancel_atom::value, now);
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

// ---- event cursors -------------------------------------------------------

namespace {

class cursor final : public event_cursor {
public:
  cursor(std::weak_ptr<controller::impl> ctl, std::string id, int64_t from,
         std::function<void()> wake)
      : ctl_(std::move(ctl)), id_(std::move(id)), next_(std::max<int64_t>(1, from)),
        wake_(std::move(wake)) {}

  batch next(size_t max) override {
    batch b;
    if (serve_backlog(b, max))
      return b;
    auto c = ctl_.lock();
    if (!c) {
      b.final = job_view{};
      b.final->state = ctl_state::lost;
      b.final->status.error = "the controller is shutting down";
      return b;
    }
    std::string journal;
    {
      std::lock_guard lock{c->mu};
      auto e = c->find(id_);
      if (!e) {
        b.final = job_view{};
        return b;
      }
      if (!e->events.empty() && e->events.front().seq <= next_) {
        auto first = e->events.front().seq;
        for (auto i = static_cast<size_t>(next_ - first); i < e->events.size() && b.events.size() < max; ++i)
          b.events.push_back(e->events[i]);
        next_ += static_cast<int64_t>(b.events.size());
        if (!b.events.empty())
          return b;
      }
      if (next_ <= e->rec.last_seq && e->events.empty()) {
        journal = (fs::path{e->rec.run_dir} / "events.jsonl").string();
      } else if (is_final(e->state()) && next_ > e->rec.last_seq) {
        b.final = c->view_of(*e);
        return b;
      } else {
        e->waiters.push_back(wake_);
        return b;
      }
    }
    // The events are no longer in memory (a final job): from its journal.
    load_backlog(journal);
    if (serve_backlog(b, max))
      return b;
    // The journal ends before last_seq (torn): nothing more will come.
    next_ = std::numeric_limits<int64_t>::max();
    return next(max);
  }

private:
  bool serve_backlog(batch& b, size_t max) {
    while (pos_ < backlog_.size() && b.events.size() < max) {
      if (backlog_[pos_].seq >= next_)
        b.events.push_back(std::move(backlog_[pos_])), next_ = b.events.back().seq + 1;
      ++pos_;
    }
    if (pos_ >= backlog_.size())
      std::vector<j::event>{}.swap(backlog_), pos_ = 0;
    return !b.events.empty();
  }

  void load_backlog(const std::string& path) {
    auto text = runtime::read_file(path);
    if (!text)
      return;
    j::each_journal_event(*text, [&](const j::event& ev) {
      if (ev.seq >= next_)
        backlog_.push_back(ev);
    });
    pos_ = 0;
  }

  std::weak_ptr<controller::impl> ctl_;
  std::string id_;
  int64_t next_;
  std::function<void()> wake_;
  std::vector<j::event> backlog_;
  size_t pos_ = 0;
};

} // namespace

expected<std::unique_ptr<event_cursor>> controller::watch(const std::string& id, int64_t from_seq,
                                                          std::function<void()> wake) {
  {
    std::lock_guard lock{impl_->mu};
    if (!impl_->find(id))
      return impl_->unknown(id);
  }
  return std::unique_ptr<event_cursor>{new cursor(impl_, id, from_seq, std::move(wake))};
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
