#include "apps/console.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>

#include <poll.h>
#include <unistd.h>

namespace troupe::apps {

namespace j = actors::job;

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

namespace {

// The few numbers of a step worth a glance, per stage.
std::string headline(const std::string& stage, const j::metric_map& metrics) {
  std::string out;
  auto add = [&](const char* label, const char* key, const char* fmt = "%.4g") {
    auto it = metrics.find(key);
    if (it == metrics.end())
      return;
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, it->second);
    out += std::string{"  "} + label + " " + buf;
  };
  if (stage == "sft") {
    add("loss", "sft/loss");
  } else if (stage == "rm") {
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

} // namespace

console_view::console_view(actors::rl::progress_style mode) : mode_(mode) {
  using actors::rl::progress_style;
  if (mode_ == progress_style::automatic)
    mode_ = ::isatty(STDERR_FILENO) != 0 ? progress_style::bar : progress_style::lines;
}

void console_view::step(const j::metrics_reported& m, double elapsed_s, int64_t done) {
  if (mode_ == actors::rl::progress_style::none)
    return;
  double eta = done > 0 ? elapsed_s / static_cast<double>(done) * static_cast<double>(m.total - m.step)
                        : NAN;
  char head[64];
  std::snprintf(head, sizeof head, "%-3s %lld/%lld", m.stage.c_str(), static_cast<long long>(m.step),
                static_cast<long long>(m.total));
  auto line = headline(m.stage, m.metrics);
  if (mode_ == actors::rl::progress_style::lines) {
    std::fprintf(stderr, "%s%s  eta %s\n", head, line.c_str(), duration(eta).c_str());
    return;
  }
  constexpr int width = 24;
  int filled = m.total > 0 ? static_cast<int>(width * m.step / m.total) : 0;
  std::string bar(static_cast<size_t>(std::clamp(filled, 0, width)), '#');
  bar.resize(width, '.');
  std::fprintf(stderr, "\r\033[K%s [%s]%s  eta %s", head, bar.c_str(), line.c_str(),
               duration(eta).c_str());
  if (m.step == m.total)
    std::fputc('\n', stderr);
  std::fflush(stderr);
}

void console_view::end_line() {
  if (mode_ == actors::rl::progress_style::bar)
    std::fputc('\n', stderr);
}

bool console_view::on_event(const j::event& e) {
  if (auto* s = std::get_if<j::stage_started>(&e.body)) {
    stage_start_us_ = e.time_us, stage_from_ = s->from_step;
  } else if (auto* m = std::get_if<j::metrics_reported>(&e.body)) {
    step(*m, static_cast<double>(e.time_us - stage_start_us_) / 1e6, m->step - stage_from_);
  } else if (auto* r = std::get_if<j::role_changed>(&e.body); r && r->status == "failed") {
    end_line();
    std::fprintf(stderr, "role %s (%s, pid %lld) failed in phase %s\n", r->role.c_str(),
                 r->process.c_str(), static_cast<long long>(r->pid), r->phase.c_str());
  } else if (r && r->rank == 0 && r->status == "restarting") { // NOTE [supervision]
    end_line();
    std::fprintf(stderr, "role %s lost in phase %s: restarting (attempt %d): %s\n", r->role.c_str(),
                 r->phase.c_str(), r->attempt, r->reason.c_str());
  } else if (r && r->rank == 0 && r->status == "restarted") {
    end_line();
    std::fprintf(stderr, "role %s restarted in %.2f s (%s, pid %lld)\n", r->role.c_str(),
                 r->recover_s, r->process.c_str(), static_cast<long long>(r->pid));
  } else if (auto* st = std::get_if<j::state_changed>(&e.body)) {
    if (st->to == j::job_state::paused || (st->from == j::job_state::paused && !j::is_final(st->to))) {
      end_line();
      std::fprintf(stderr, "job %s%s%s\n", std::string{j::to_string(st->to)}.c_str(),
                   st->reason.empty() ? "" : ": ", st->reason.c_str());
    }
    return j::is_final(st->to);
  }
  return false;
}

caf::actor spawn_console(caf::actor_system& sys, console_view* view, const j::job_actor& job) {
  return sys.spawn([view, job](caf::event_based_actor* self) -> caf::behavior {
    // A job actor that ends without a final event (it threw: NOTE [job
    // actor failures]) must not leave `troupe run` waiting on its console.
    self->monitor(job);
    self->set_down_handler([self](caf::down_msg&) { self->quit(); });
    return {[self, view](const j::event& e) {
      if (view->on_event(e))
        self->quit();
    }};
  });
}

// ---- signals ----

namespace {

std::atomic<int> g_signals{0};
std::atomic<int> g_first{0};
int g_wake[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  int expected = 0;
  g_first.compare_exchange_strong(expected, sig);
  if (g_signals.fetch_add(1) + 1 >= 3) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  char c = static_cast<char>(sig);
  [[maybe_unused]] auto n = ::write(g_wake[1], &c, 1);
}

using steady = std::chrono::steady_clock;

// The watcher's wait for the next byte: -1 = the deadline passed, 0 = the
// pipe closed or a stop byte, else the signal's number.
int next_signal(std::optional<steady::time_point> deadline) {
  for (;;) {
    int timeout_ms = -1;
    if (deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - steady::now());
      if (left.count() <= 0)
        return -1;
      timeout_ms = static_cast<int>(std::min<int64_t>(left.count(), 1 << 30));
    }
    pollfd p{g_wake[0], POLLIN, 0};
    int r = ::poll(&p, 1, timeout_ms);
    if (r < 0 && errno == EINTR)
      continue;
    if (r == 0)
      continue; // the deadline is checked at the top
    char c = 0;
    if (r < 0 || ::read(g_wake[0], &c, 1) != 1)
      return 0;
    return static_cast<unsigned char>(c);
  }
}

} // namespace

signal_watcher::signal_watcher(stop_bounds bounds) : bounds_(bounds) {
  if (::pipe(g_wake) != 0)
    return;
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  thread_ = std::thread{[this] { loop(); }};
}

signal_watcher::~signal_watcher() {
  char c = 0;
  [[maybe_unused]] auto n = ::write(g_wake[1], &c, 1);
  if (thread_.joinable())
    thread_.join();
}

void signal_watcher::watch(const j::job_actor& job) {
  std::lock_guard lock{mu_};
  job_ = job;
  if (g_signals.load() > 0)
    send();
}

void signal_watcher::forget() {
  std::lock_guard lock{mu_};
  job_.reset();
}

bool signal_watcher::stopped_now() {
  return g_first.load() == SIGTERM || g_signals.load() >= 2;
}

int signal_watcher::exit_status() {
  return 128 + (g_first.load() ? g_first.load() : SIGINT);
}

void signal_watcher::loop() {
  std::optional<steady::time_point> deadline;
  for (;;) {
    int sig = next_signal(deadline);
    if (sig == 0)
      return;
    if (sig < 0) {
      char msg[160];
      int n = std::snprintf(msg, sizeof msg,
                            "\ntroupe: the job did not stop within the bound after %s: exiting now\n",
                            g_first.load() == SIGTERM ? "SIGTERM" : "the signal");
      [[maybe_unused]] auto w = ::write(STDERR_FILENO, msg, static_cast<size_t>(std::max(n, 0)));
      ::_exit(exit_status());
    }
    auto bound = stopped_now() ? bounds_.now_s : bounds_.checkpoint_s;
    auto at = steady::now() + std::chrono::milliseconds(static_cast<int64_t>(bound * 1000));
    deadline = deadline ? std::min(*deadline, at) : at;
    std::lock_guard lock{mu_};
    send();
  }
}

void signal_watcher::send() {
  if (job_)
    caf::anon_send(*job_, j::cancel_atom::value, stopped_now());
}

} // namespace troupe::apps
