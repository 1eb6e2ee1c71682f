#include "apps/run.hpp"

#include "actors/actor_system.hpp"
#include "actors/rl/job.hpp"
#include "actors/rl/placement.hpp"
#include "cluster/role_host.hpp"

#include <caf/all.hpp>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <optional>
#include <thread>
#include <unistd.h>

namespace troupe::apps {

namespace {

// SIGINT / SIGTERM → cancel (checkpoint, then stop); a second → cancel
// --now; a third → the default action. The handler only counts and wakes
// the watcher thread through a pipe (async-signal-safe).
std::atomic<int> g_signals{0};
int g_wake[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  if (g_signals.fetch_add(1) + 1 >= 3) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  char c = 1;
  [[maybe_unused]] auto n = ::write(g_wake[1], &c, 1);
}

// Turns signals into cancel commands to the job actor, once it exists.
class signal_watcher {
public:
  signal_watcher() {
    if (::pipe(g_wake) != 0)
      return;
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, nullptr);
    sigaction(SIGTERM, &sa, nullptr);
    thread_ = std::thread{[this] { loop(); }};
  }
  ~signal_watcher() {
    char c = 0;
    [[maybe_unused]] auto n = ::write(g_wake[1], &c, 1);
    if (thread_.joinable())
      thread_.join();
  }
  void watch(const actors::job::job_actor& job) {
    std::lock_guard lock{mu_};
    job_ = job;
    if (g_signals.load() > 0)
      send();
  }

private:
  void loop() {
    char c = 0;
    while (::read(g_wake[0], &c, 1) == 1 && c != 0) {
      std::lock_guard lock{mu_};
      send();
    }
  }
  void send() {
    if (job_)
      caf::anon_send(*job_, actors::job::cancel_atom::value, g_signals.load() >= 2);
  }
  std::mutex mu_;
  std::optional<actors::job::job_actor> job_;
  std::thread thread_;
};

std::string duration(double s) {
  if (!std::isfinite(s) || s < 0)
    return "?";
  auto t = static_cast<long long>(s + 0.5);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", t / 3600, (t / 60) % 60);
  else if (t >= 60)
    std::snprintf(buf, sizeof buf, "%lldm%02llds", t / 60, t % 60);
  else
    std::snprintf(buf, sizeof buf, "%llds", t);
  return buf;
}

// The few numbers of a step worth a glance, per stage.
std::string headline(const actors::rl::progress_event& e) {
  std::string out;
  auto add = [&](const char* label, const char* key, const char* fmt = "%.4g") {
    auto it = e.metrics.find(key);
    if (it == e.metrics.end())
      return;
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, it->second);
    out += std::string{"  "} + label + " " + buf;
  };
  if (e.stage == "sft") {
    add("loss", "sft/loss");
  } else if (e.stage == "rm") {
    add("loss", "rm/loss");
    add("acc", "rm/accuracy", "%.3f");
    add("eval_acc", "rm/eval_accuracy", "%.3f");
  } else {
    add("score", "critic/score/mean", "%.3f");
    add("kl", "actor/reward_kl_penalty");
    add("pg_loss", "actor/pg_loss");
    add("vf_loss", "critic/vf_loss");
    add("tok/s", "perf/throughput", "%.0f");
  }
  add("val", "val/score/mean", "%.3f");
  return out;
}

class progress_printer;
caf::behavior console(caf::event_based_actor* self, progress_printer* printer);

class progress_printer {
public:
  explicit progress_printer(std::string mode) : mode_(std::move(mode)) {
    tty_ = ::isatty(STDERR_FILENO) != 0;
    if (mode_ == "auto")
      mode_ = tty_ ? "bar" : "lines";
  }

  /// `done`: the steps this run has made of the stage (for the ETA).
  void operator()(const actors::rl::progress_event& e, int64_t done) {
    if (mode_ == "none")
      return;
    double eta = done > 0 ? e.elapsed_s / static_cast<double>(done) *
                              static_cast<double>(e.total - e.step)
                          : NAN;
    char head[64];
    std::snprintf(head, sizeof head, "%-3s %lld/%lld", e.stage.c_str(),
                  static_cast<long long>(e.step), static_cast<long long>(e.total));
    if (mode_ == "lines") {
      std::fprintf(stderr, "%s%s  eta %s\n", head, headline(e).c_str(), duration(eta).c_str());
      return;
    }
    constexpr int width = 24;
    int filled = e.total > 0 ? static_cast<int>(width * e.step / e.total) : 0;
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "\r\033[K%s [%s]%s  eta %s", head, bar.c_str(), headline(e).c_str(),
                 duration(eta).c_str());
    if (e.step == e.total)
      std::fputc('\n', stderr);
    std::fflush(stderr);
  }

  void end_line() {
    if (mode_ == "bar")
      std::fputc('\n', stderr);
  }

private:
  std::string mode_;
  bool tty_ = false;
};

// The terminal as a subscriber of the job's events: progress per step,
// pauses and failures; it ends with the job's final state.
caf::behavior console(caf::event_based_actor* self, progress_printer* printer) {
  struct stage_clock {
    int64_t start_us = 0;
    int64_t from = 0;
  };
  auto clock = std::make_shared<stage_clock>();
  return {[=](const actors::job::event& e) {
    namespace j = actors::job;
    if (auto* s = std::get_if<j::stage_started>(&e.body)) {
      *clock = {e.time_us, s->from_step};
    } else if (auto* m = std::get_if<j::metrics_reported>(&e.body)) {
      actors::rl::progress_event p{m->stage, m->step, m->total, m->metrics,
                                   static_cast<double>(e.time_us - clock->start_us) / 1e6};
      (*printer)(p, m->step - clock->from);
    } else if (auto* r = std::get_if<j::role_changed>(&e.body); r && r->status == "failed") {
      printer->end_line();
      std::fprintf(stderr, "role %s (%s, pid %lld) failed in phase %s\n", r->role.c_str(),
                   r->process.c_str(), static_cast<long long>(r->pid), r->phase.c_str());
    } else if (auto* st = std::get_if<j::state_changed>(&e.body)) {
      if (st->to == j::job_state::paused || (st->from == j::job_state::paused && !j::is_final(st->to))) {
        printer->end_line();
        std::fprintf(stderr, "job %s%s%s\n", std::string{j::to_string(st->to)}.c_str(),
                     st->reason.empty() ? "" : ": ", st->reason.c_str());
      }
      if (j::is_final(st->to))
        self->quit();
    }
  }};
}

} // namespace

int config_show_command(const std::string& path, const std::vector<std::string>& overrides,
                        bool comments) {
  auto cfg = actors::rl::load_job(path, overrides);
  if (!cfg) {
    std::fprintf(stderr, "troupe config show: %s\n", describe(cfg.error()).c_str());
    return 1;
  }
  std::cout << runtime::to_yaml(*cfg, comments);
  return 0;
}

int plan_command(const std::string& path, const std::vector<std::string>& overrides) {
  auto cfg = actors::rl::load_job(path, overrides);
  if (!cfg) {
    std::fprintf(stderr, "troupe plan: %s\n", describe(cfg.error()).c_str());
    return 1;
  }
  auto plan = actors::rl::make_plan(*cfg);
  if (!plan) {
    std::fprintf(stderr, "troupe plan: %s\n", describe(plan.error()).c_str());
    return 1;
  }
  std::cout << plan->render();
  return 0;
}

int run_job_command(const run_command_options& o) {
  auto cfg = actors::rl::load_job(o.config_path, o.overrides);
  if (!cfg) {
    std::fprintf(stderr, "troupe run: %s\n", describe(cfg.error()).c_str());
    return 1;
  }
  progress_printer printer{cfg->run.progress};
  expected<actors::rl::job_summary> summary = make_error(errc::internal, "not run");
  {
    caf::actor_system_config sys_cfg;
    actors::configure(sys_cfg);
    cluster::configure_network(sys_cfg);
    caf::actor_system sys{sys_cfg};
    signal_watcher signals;
    // load and validate → spawn the job actor → subscribe the console →
    // start → wait for a final state (run_job).
    std::optional<caf::actor> printer_actor;
    actors::rl::run_options ro;
    ro.resume = o.resume;
    ro.on_spawn = [&](const actors::job::job_actor& job) {
      auto c = sys.spawn(console, &printer);
      caf::scoped_actor self{sys};
      self->request(job, std::chrono::seconds(10), actors::job::subscribe_atom::value, c,
                    int64_t{1})
        .receive([&](int64_t) { printer_actor = c; },
                 [&](caf::error&) { self->send_exit(c, caf::exit_reason::user_shutdown); });
      signals.watch(job);
    };
    cluster::launch_options lo;
    lo.timeout_ms = static_cast<int64_t>(cfg->run.timeouts.compute_s * 1000);
    summary = cluster::run_placed_job(sys, *cfg, ro, lo);
    if (printer_actor) {
      caf::scoped_actor self{sys};
      self->wait_for(*printer_actor); // the last lines are printed
    }
  }
  if (!summary) {
    printer.end_line();
    std::fprintf(stderr, "troupe run: %s\n", describe(summary.error()).c_str());
    return 1;
  }
  std::fprintf(stderr, "\nrun %s: %s\n", cfg->run.name.c_str(), summary->run_dir.c_str());
  for (const auto& s : summary->stages) {
    std::fprintf(stderr, "  %-3s %s %lld steps", s.stage.c_str(),
                 s.skipped ? "(done earlier)" : (s.stopped ? "stopped after" : "finished,"),
                 static_cast<long long>(s.steps));
    if (!s.skipped)
      std::fprintf(stderr, " in %s", duration(s.seconds).c_str());
    for (const char* key : {"val/score/mean", "val/accuracy", "rm/eval_accuracy"}) {
      auto it = s.metrics.find(key);
      if (it != s.metrics.end())
        std::fprintf(stderr, "  %s %.3f", key, it->second);
    }
    if (!s.output.empty() && !s.stopped)
      std::fprintf(stderr, "  → %s", s.output.c_str());
    std::fputc('\n', stderr);
  }
  if (summary->stopped) {
    std::fprintf(stderr, g_signals.load() >= 2
                           ? "cancelled --now: no checkpoint; --resume continues from the last one\n"
                           : "stopped: checkpoint written; continue with --resume\n");
    return 130;
  }
  return 0;
}

} // namespace troupe::apps
