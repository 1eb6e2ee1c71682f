// Supervision benchmarks (NOTE [supervision] in actors/rl/supervision.hpp):
// the time from a role's kill to the job running again, per role kind and
// placement, against the same job without kills in the same run.
//  - workers: the trainers in one worker, the rollout in a second, the
//    reference and the reward in a third; debug.kills end the rollout's
//    worker in generation, then the judges' worker in the reference's
//    phase (the reward there is lost with it and rebuilt in the new
//    process), then the rollout's again in a weight sync;
//  - in one process: the same kills end the roles' actors;
//  - trainer DP ranks: policy and critic as dp 2 over two workers (rank r
//    of each in worker r); a policy rank dies inside a collective of its
//    update (its worker ends, the critic's rank there with it), then a
//    critic rank at its update's request (the policy's rank with it) —
//    each restarts from its surviving peer's state (NOTE [peer state]);
//  - the cost of being ready: the same dp 2 job without kills, its
//    trainers restartable (each update first keeps the state) or not.
// Each restart reports recover_s (loss seen → role ready: process start,
// model load, the weights received again) and the lost time of its
// iteration: its step time minus the median step of the run without kills.
// Usage: bench_recovery [iterations=6] [hidden=512] [layers=6] [only=all|readiness]
#include "actors/actor_system.hpp"
#include "actors/rl/job.hpp"
#include "actors/rl/placement.hpp"
#include "bench/bench_jobs.hpp"
#include "cluster/role_host.hpp"
#include "cluster/workers.hpp"
#include "runtime/config.hpp"

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <unistd.h>

using namespace troupe;

namespace {

const std::vector<std::string> three_workers = {
    "placement.mode=hybrid",
    "placement.pools=[{name: train, devices: 1}, {name: gen, devices: 1}, {name: judge, devices: "
    "1}]",
    "placement.roles=[{role: rollout, pool: gen}, {role: reward, pool: judge}, "
    "{role: reference, pool: judge}]"};

const std::string kills = "debug.kills=[{role: rollout, iteration: 2, phase: gen}, "
                          "{role: reference, iteration: 3, phase: ref}, "
                          "{role: rollout, iteration: 4, phase: weight_sync}]";

const std::vector<std::string> dp_workers = {
    "placement.mode=hybrid",
    "placement.pools=[{name: train, devices: 2}, {name: gen, devices: 1}, {name: judge, devices: "
    "1}]",
    "placement.roles=[{role: policy, pool: train, dp: 2}, {role: critic, pool: train, dp: 2}, "
    "{role: rollout, pool: gen}, {role: reward, pool: judge}, {role: reference, pool: judge}]"};

const std::string trainers_restart =
    "supervision.roles=[{role: rollout, backoff_ms: 0}, {role: reference, backoff_ms: 0}, "
    "{role: reward, backoff_ms: 0}, {role: policy, max_restarts: 3, backoff_ms: 0}, "
    "{role: critic, max_restarts: 3, backoff_ms: 0}]";

const std::string trainer_kills =
    "debug.kills=[{role: policy, iteration: 2, phase: update_actor, rank: 1, collective: 3}, "
    "{role: critic, iteration: 3, phase: update_critic, rank: 1}]";

struct restart {
  std::string role, phase;
  int64_t step = 0;
  double recover_s = 0;
};

struct outcome {
  std::map<int64_t, double> step_s; // by iteration
  std::vector<restart> restarts;
};

expected<outcome> run_once(const std::string& dir, int iterations, int hidden, int layers,
                           bool workers, const std::vector<std::string>& sets) {
  std::filesystem::remove_all(dir);
  std::string yaml = bench::placed_job_yaml(dir, iterations, hidden, layers) +
                     "supervision:\n"
                     "  roles: [{role: rollout, backoff_ms: 0}, {role: reference, backoff_ms: 0}, "
                     "{role: reward, backoff_ms: 0}]\n";
  auto cfg = bench::load_bench_job(yaml, sets);
  if (!cfg)
    return cfg.error();
  caf::actor_system_config sc;
  actors::configure(sc);
  cluster::configure_network(sc);
  caf::actor_system sys{sc};
  expected<actors::rl::job_summary> sum = make_error(errc::internal, "not run");
  if (workers) {
    cluster::launch_options lo;
    lo.executable = TROUPE_BINARY_PATH;
    lo.log_dir = dir + "/workers";
    lo.timeout_ms = 600000;
    sum = cluster::run_placed_job(sys, *cfg, {}, lo);
  } else {
    sum = actors::rl::run_job(sys, *cfg, {});
  }
  if (!sum)
    return sum.error();
  outcome out;
  std::ifstream metrics(dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("timing_s/step"))
      out.step_s[j.value("step", int64_t{0})] = j["timing_s/step"].get<double>();
  }
  // Each restart happens inside a phase: the step of the latest phase started.
  std::ifstream events(dir + "/events.jsonl");
  int64_t step = 0;
  for (std::string line; std::getline(events, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") == "phase_started")
      step = j.value("iteration", int64_t{0});
    if (j.value("kind", "") == "role" && j.value("status", "") == "restarted" &&
        j.value("rank", 0) == 0)
      out.restarts.push_back({j["role"], j["phase"], step, j["recover_s"].get<double>()});
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The median step of iterations 2.. (the first pays for warm-up).
double median_step(const outcome& o) {
  std::vector<double> steps;
  for (const auto& [it, s] : o.step_s)
    if (it > 1)
      steps.push_back(s);
  return median(steps);
}

int section(const std::string& root, const char* name, bool workers, std::vector<std::string> sets,
            const std::string& kill_list, int iterations, int hidden, int layers) {
  auto plain = run_once(root + "/plain", iterations, hidden, layers, workers, sets);
  sets.push_back(kill_list);
  auto killed = run_once(root + "/killed", iterations, hidden, layers, workers, sets);
  for (auto* r : {&plain, &killed})
    if (!*r) {
      std::fprintf(stderr, "bench_recovery (%s): %s\n", name, describe(r->error()).c_str());
      return 1;
    }
  const double med = median_step(*plain);
  std::printf("%s: step median without kills %.3f s (iterations 2..%d)\n", name, med, iterations);
  std::printf("  %-10s %-12s %10s %22s\n", "role", "lost in", "recover s", "iteration's extra s");
  for (const auto& r : killed->restarts) {
    auto s = killed->step_s.count(r.step) ? killed->step_s.at(r.step) : 0.0;
    std::printf("  %-10s %-12s %10.2f %22.2f\n", r.role.c_str(), r.phase.c_str(), r.recover_s,
                s - med);
  }
  return 0;
}

// NOTE [peer state]: what readiness costs — each update of a restartable
// trainer first serialises its state — as the median step, alternating
// runs without and with it.
int readiness(const std::string& root, int iterations, int hidden, int layers) {
  std::vector<double> off, on;
  for (int round = 0; round < 2; ++round)
    for (bool ready : {false, true}) {
      auto sets = dp_workers;
      if (ready)
        sets.push_back(trainers_restart);
      auto o = run_once(root + "/ready", iterations, hidden, layers, true, sets);
      if (!o) {
        std::fprintf(stderr, "bench_recovery (readiness): %s\n", describe(o.error()).c_str());
        return 1;
      }
      (ready ? on : off).push_back(median_step(*o));
    }
  const double a = median(off), b = median(on);
  std::printf("cost of being ready (dp 2 trainers in workers, no kills): step median %.3f s "
              "without, %.3f s with the state kept before each update (%.3fx; runs %.3f/%.3f, "
              "%.3f/%.3f)\n",
              a, b, b / a, off[0], on[0], off[1], on[1]);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  int iterations = argc > 1 ? std::atoi(argv[1]) : 6;
  int hidden = argc > 2 ? std::atoi(argv[2]) : 512;
  int layers = argc > 3 ? std::atoi(argv[3]) : 6;
  const std::string only = argc > 4 ? argv[4] : "all";
  if (only != "all" && only != "readiness") {
    std::fprintf(stderr, "bench_recovery: the 4th argument is all or readiness, not '%s'\n",
                 only.c_str());
    return 2;
  }
  if (iterations < 5) {
    std::fprintf(stderr, "bench_recovery: at least 5 iterations (the kills are in 2..4)\n");
    return 2;
  }
  std::printf("machine: %ld cores online; model hidden %d, %d layers; %d iterations of 8 prompts "
              "x 2 samples\n",
              sysconf(_SC_NPROCESSORS_ONLN), hidden, layers, iterations);
  auto root = (std::filesystem::temp_directory_path() /
               ("troupe_bench_recovery_" + std::to_string(::getpid())))
                  .string();
  int rc = 0;
  if (only == "all")
    rc = section(root + "/workers", "worker processes", true, three_workers, kills, iterations,
                 hidden, layers);
  if (rc == 0 && only == "all")
    rc = section(root + "/inproc", "one process", false, {}, kills, iterations, hidden, layers);
  if (rc == 0 && only == "all") {
    auto sets = dp_workers;
    sets.push_back(trainers_restart);
    rc = section(root + "/trainers", "trainer DP ranks in worker processes", true, sets,
                 trainer_kills, iterations, hidden, layers);
  }
  if (rc == 0)
    rc = readiness(root + "/readiness", iterations, hidden, layers);
  std::filesystem::remove_all(root);
  return rc;
}
