// RLHF job benchmarks (issue 4), each against a baseline in the same run:
//  1. in-process actor request round trip (CAF request/response between a
//     blocking and an event-based actor) vs a bare thread ping-pong through a
//     mutex and condition variable — the floor of any cross-thread handoff;
//  2. orchestration share of PPO steps: per iteration, 1 − (time the roles
//     spent computing) / (step wall time), on the quickstart's model shape —
//     with no job command pending, and with the job actor consulted at every
//     phase boundary while a subscriber takes every event (the job actor's
//     worst case; same run);
//  3. the exporters' share (the job without its TensorBoard files);
//  4. the cost of supervision's readiness (NOTE [supervision]): the job's
//     roles behind their role proxies, as troupe runs them, against the
//     same roles reached directly (a host that builds them without proxies,
//     as troupe did before supervision).
#include "actors/actor_system.hpp"
#include "actors/rl/job.hpp"
#include "actors/rl/roles.hpp"
#include "runtime/config.hpp"

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <thread>
#include <unistd.h>

using namespace troupe;

namespace {

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

// Microseconds per round trip between two threads through a mutex + condvar.
std::vector<double> thread_ping_pong(int count) {
  std::mutex mu;
  std::condition_variable cv;
  int turn = 0; // 0: main's turn to send, 1: echo's turn to reply
  bool done = false;
  std::thread echo([&] {
    std::unique_lock lock(mu);
    while (true) {
      cv.wait(lock, [&] { return turn == 1 || done; });
      if (done)
        return;
      turn = 0;
      cv.notify_all();
    }
  });
  std::vector<double> out;
  out.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    std::unique_lock lock(mu);
    turn = 1;
    cv.notify_all();
    cv.wait(lock, [&] { return turn == 0; });
    out.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  {
    std::lock_guard lock(mu);
    done = true;
  }
  cv.notify_all();
  echo.join();
  return out;
}

struct job_measure {
  std::vector<double> share, step, phases;
};

// Roles in this process reached directly, without role proxies.
class direct_host final : public actors::rl::role_host {
public:
  expected<std::vector<caf::actor>> spawn(caf::actor_system& sys,
                                          const actors::rl::role_spec& spec) override {
    return actors::rl::spawn_ranks(
        spec, stores_, store_host(),
        [&](const actors::rl::role_spec& s) { return actors::rl::spawn_role(sys, s); });
  }

private:
  std::vector<std::shared_ptr<void>> stores_;
};

// Runs a PPO job of `iterations` and reads its metrics; `forced`: a
// subscriber and a pending command (NOTE [job boundaries]) the whole run;
// `tensorboard`: the job writes its TensorBoard files too.
std::optional<job_measure> measure_job(int iterations, bool forced, bool tensorboard = true,
                                       actors::rl::role_host* host = nullptr) {
  auto dir = std::filesystem::temp_directory_path() /
             ("troupe_bench_job_" + std::to_string(::getpid()) + (forced ? "_f" : "") +
              (tensorboard ? "" : "_n") + (host ? "_d" : ""));
  std::filesystem::remove_all(dir);
  std::string yaml = "run: {dir: '" + dir.string() +
                     "', progress: none}\n"
                     "stages: [rl]\n"
                     "rl: {iterations: " +
                     std::to_string(iterations) +
                     ", prompts_per_iteration: 64, samples_per_prompt: 2, minibatches: 4,\n"
                     "     eval_every: 0, checkpoint_every: 0, critic: {init: base},\n"
                     "     generation: {max_tokens: 10}}\n";
  auto doc = runtime::yaml_document::from_text(yaml, "bench.yaml");
  auto cfg = runtime::load_config<actors::rl::job_config>(*doc);
  if (!cfg) {
    std::fprintf(stderr, "%s\n", describe(cfg.error()).c_str());
    return std::nullopt;
  }
  {
    caf::actor_system_config sc;
    actors::configure(sc);
    caf::actor_system sys{sc};
    actors::rl::run_options o;
    o.tensorboard = tensorboard;
    o.host = host;
    o.on_spawn = [&](const actors::job::job_actor& job) {
      if (!forced)
        return;
      caf::scoped_actor self{sys};
      auto sink = sys.spawn([](caf::event_based_actor* a) -> caf::behavior {
        return {[](const actors::job::event&) {}};
      });
      self->request(job, std::chrono::seconds(10), actors::job::subscribe_atom::value, sink,
                    int64_t{1})
          .receive([](int64_t) {}, [](caf::error&) {});
      self->request(job, std::chrono::seconds(10), actors::job::pause_at_atom::value,
                    std::string{"rl:999999"})
          .receive([](actors::job::job_status&) {}, [](caf::error&) {});
    };
    auto r = actors::rl::run_job(sys, *cfg, o);
    if (!r) {
      std::fprintf(stderr, "job: %s\n", describe(r.error()).c_str());
      return std::nullopt;
    }
  }
  std::ifstream in(dir / "metrics.jsonl");
  job_measure out;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["stage"] != "rl" || j["step"].get<int>() < 2) // skip step 0 (eval) and warm-up step 1
      continue;
    out.share.push_back(j["perf/orchestration_share"].get<double>());
    out.step.push_back(j["timing_s/step"].get<double>());
    double sum = 0;
    for (const auto& [k, v] : j.items())
      if (k.rfind("timing_s/", 0) == 0 && k != "timing_s/step" && k != "timing_s/testing")
        sum += v.get<double>();
    out.phases.push_back(sum / j["timing_s/step"].get<double>());
  }
  std::filesystem::remove_all(dir);
  if (out.share.empty()) {
    std::fprintf(stderr, "no iterations measured\n");
    return std::nullopt;
  }
  return out;
}

} // namespace

int main(int argc, char** argv) {
  int iterations = argc > 1 ? std::atoi(argv[1]) : 12;
  std::printf("machine: %ld cores online\n", sysconf(_SC_NPROCESSORS_ONLN));

  // 1. round trip
  {
    caf::actor_system_config sc;
    actors::configure(sc);
    caf::actor_system sys{sc};
    auto rt = actors::measure_round_trip(sys, 20000, 10000);
    if (!rt) {
      std::fprintf(stderr, "round trip: %s\n", describe(rt.error()).c_str());
      return 1;
    }
    auto base = thread_ping_pong(20000);
    double p50 = percentile(*rt, 0.5), b50 = percentile(base, 0.5);
    std::printf("actor round trip:  p50 %.2f us  p99 %.2f us  (floor ≤ 5 us: %s)\n", p50,
                percentile(*rt, 0.99), p50 <= 5.0 ? "met" : "NOT met");
    std::printf("thread ping-pong:  p50 %.2f us  p99 %.2f us  → actor / bare handoff = %.2fx\n",
                b50, percentile(base, 0.99), p50 / b50);
  }

  // 2. orchestration share of PPO steps (quickstart shape, stages: rl only),
  // with no command pending (the boundaries' fast path: one atomic load) and
  // with the job actor asked at every phase boundary (a breakpoint that never
  // matches keeps a command pending) while a subscriber receives every event.
  auto fast = measure_job(iterations, false);
  auto forced = measure_job(iterations, true);
  // 3. the exporters' share: the same job without its TensorBoard files.
  auto bare = measure_job(iterations, false, false);
  // 4. supervision's readiness: the same job with its roles reached directly.
  direct_host direct;
  auto unproxied = measure_job(iterations, false, true, &direct);
  if (!fast || !forced || !bare || !unproxied)
    return 1;
  for (const auto* m : {&*fast, &*forced})
    std::printf("%-34s step median %.3f s over %zu iterations, orchestration share median "
                "%.2f%% max %.2f%%, timed phases / step %.4f\n",
                m == &*fast ? "PPO step, no command pending:" : "PPO step, boundary round trips:",
                percentile(m->step, 0.5), m->step.size(), 100 * percentile(m->share, 0.5),
                100 * *std::max_element(m->share.begin(), m->share.end()),
                percentile(m->phases, 0.5));
  double med = percentile(fast->share, 0.5);
  std::printf("orchestration share (no command pending): median %.2f%%  (floor ≤ 5%%: %s); "
              "with a round trip at every boundary: %.2f%% (%+.2f points)\n",
              100 * med, med <= 0.05 ? "met" : "NOT met", 100 * percentile(forced->share, 0.5),
              100 * (percentile(forced->share, 0.5) - med));
  double with_tb = percentile(fast->step, 0.5), without = percentile(bare->step, 0.5);
  std::printf("PPO step with TensorBoard files: median %.3f s; without: %.3f s; ratio %.3fx "
              "(orchestration share %.2f%% vs %.2f%%)\n",
              with_tb, without, with_tb / without, 100 * med, 100 * percentile(bare->share, 0.5));
  double direct_step = percentile(unproxied->step, 0.5);
  std::printf("PPO step with role proxies (supervision-ready): median %.3f s; roles reached "
              "directly: %.3f s; ratio %.3fx (orchestration share %.2f%% vs %.2f%%)\n",
              with_tb, direct_step, with_tb / direct_step, 100 * med,
              100 * percentile(unproxied->share, 0.5));
  return 0;
}
