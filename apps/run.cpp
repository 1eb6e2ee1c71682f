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
#include <unistd.h>

namespace troupe::apps {

namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_signal(int sig) {
  if (g_stop.load()) {
    // A second signal: stop now, without a checkpoint.
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_stop.store(true);
}

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

class progress_printer {
public:
  explicit progress_printer(std::string mode) : mode_(std::move(mode)) {
    tty_ = ::isatty(STDERR_FILENO) != 0;
    if (mode_ == "auto")
      mode_ = tty_ ? "bar" : "lines";
  }

  void operator()(const actors::rl::progress_event& e) {
    if (mode_ == "none")
      return;
    double eta = e.step > 0 ? e.elapsed_s / static_cast<double>(e.step) *
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
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  progress_printer printer{cfg->run.progress};
  actors::rl::run_options ro;
  ro.resume = o.resume;
  ro.stop = &g_stop;
  ro.on_progress = [&](const actors::rl::progress_event& e) { printer(e); };
  expected<actors::rl::job_summary> summary = make_error(errc::internal, "not run");
  {
    caf::actor_system_config sys_cfg;
    actors::configure(sys_cfg);
    cluster::configure_network(sys_cfg);
    caf::actor_system sys{sys_cfg};
    cluster::launch_options lo;
    lo.timeout_ms = static_cast<int64_t>(cfg->run.request_timeout_s * 1000);
    summary = cluster::run_placed_job(sys, *cfg, ro, lo);
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
    std::fprintf(stderr, "stopped: checkpoint written; continue with --resume\n");
    return 130;
  }
  return 0;
}

} // namespace troupe::apps
