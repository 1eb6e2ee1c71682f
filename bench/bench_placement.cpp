// Placement benchmarks (issue 5), each against its baseline in the same run:
//  1. co-located peak memory: the peak resident set (VmHWM) of the one
//     worker that hosts every role over iterations 2..N (the peak is reset
//     after iteration 1 and read at the last one, before the stage's final
//     checkpoint and model save), with placement.offload (the rollout's KV
//     pool freed after generation, the reference's weights after its
//     log-probs, optimizer states and gradients to disk after each update)
//     vs every role's state resident;
//     and the step time each costs;
//  2. disaggregated step time (rollout in one worker, the other roles in
//     another, one compute thread each) with rl.staleness 1 and 2 — the
//     next batches generated while this one trains — without and with
//     in-flight weight updates (and paced ones, rl.inflight_steps), vs
//     synchronous; and each as a share of the
//     ideal overlap: the synchronous step's generation G and the rest T
//     give the ideal step max(G, T), and a mode's share is how much of the
//     possible saving (G + T − max(G, T)) it realises.
// Usage: bench_placement [iterations=4] [hidden=512] [layers=6] [all|offload|async]
//                        [max_tokens=96 (the async section's responses)]
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
#include <string>
#include <vector>

#include <unistd.h>

using namespace troupe;

namespace {

int64_t peak_rss_of(int64_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0)
      return std::stoll(line.substr(6)) * 1024;
  return -1;
}

struct outcome {
  int64_t peak_rss = 0;
  double step_s = 0;
  double gen_s = 0; ///< timing_s/gen, the step's generation (synchronous: all of it)
  /// Seconds per 1000 trained tokens (perf/total_num_tokens): the responses'
  /// lengths change as the policy learns, and a stale batch's are an older
  /// policy's, so steps are compared per token.
  double step_s_per_kt = 0, gen_s_per_kt = 0;
  double offloaded_mb = 0;
};

// Runs the job; the step times of the iterations after the first `warmup`.
expected<outcome> run_once(const std::string& dir, int iterations, int hidden, int layers,
                           const std::vector<std::string>& sets, int warmup = 1) {
  std::string yaml = bench::placed_job_yaml(dir, iterations, hidden, layers);
  auto cfg = bench::load_bench_job(yaml, sets);
  if (!cfg)
    return cfg.error();
  auto plan = actors::rl::make_plan(*cfg);
  if (!plan)
    return plan.error();
  caf::actor_system_config sc;
  actors::configure(sc);
  cluster::configure_network(sc);
  caf::actor_system sys{sc};
  cluster::launch_options lo;
  lo.executable = TROUPE_BINARY_PATH;
  lo.log_dir = dir + "/workers";
  lo.timeout_ms = 600000;
  auto host = cluster::worker_host::launch(sys, *plan, lo);
  if (!host)
    return host.error();
  auto pid = (*host)->workers().front().pid;
  outcome out;
  actors::rl::run_options ro;
  ro.host = host->get();
  ro.on_progress = [&](const actors::rl::progress_event& e) {
    if (e.step == 1) // reset the peak: iterations 2..N are measured
      std::ofstream("/proc/" + std::to_string(pid) + "/clear_refs") << "5";
    if (e.step == e.total)
      out.peak_rss = peak_rss_of(pid);
  };
  auto sum = actors::rl::run_job(sys, *cfg, ro);
  if (!sum)
    return sum.error();
  if (auto ok = (*host)->shutdown(30000); !ok)
    return ok.error();
  std::ifstream in(dir + "/metrics.jsonl");
  std::string line;
  int n = 0;
  double tokens = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.value("training/global_step", 0.0) < warmup + 1)
      continue;
    out.step_s += j.value("timing_s/step", 0.0);
    out.gen_s += j.value("timing_s/gen", 0.0);
    tokens += j.value("perf/total_num_tokens", 0.0);
    out.offloaded_mb = j.value("perf/offloaded_bytes", 0.0) / (1024.0 * 1024.0);
    ++n;
  }
  if (tokens > 0) {
    out.step_s_per_kt = 1000 * out.step_s / tokens;
    out.gen_s_per_kt = 1000 * out.gen_s / tokens;
  }
  if (n > 0) {
    out.step_s /= n;
    out.gen_s /= n;
  }
  return out;
}

int offload_section(const std::string& root, int iterations, int hidden, int layers) {
  std::printf("co-located PPO, one worker hosting policy, critic, reference, reward, rollout\n");
  std::printf("model: hidden %d, %d layers; %d iterations of 8 prompts x 2 samples; KV pool 256 MiB\n",
              hidden, layers, iterations);
  auto resident = run_once(root + "/resident", iterations, hidden, layers,
                           {"placement.mode=colocated", "placement.offload=false"});
  auto offload = run_once(root + "/offload", iterations, hidden, layers,
                          {"placement.mode=colocated", "placement.offload=true"});
  for (auto* r : {&resident, &offload})
    if (!*r) {
      std::fprintf(stderr, "bench_placement: %s\n", describe(r->error()).c_str());
      return 1;
    }
  auto mb = [](int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); };
  std::printf("%-22s %14s %12s %16s\n", "", "peak RSS MiB", "step s", "offloaded MiB");
  std::printf("%-22s %14.1f %12.3f %16s\n", "all resident", mb(resident->peak_rss), resident->step_s, "-");
  std::printf("%-22s %14.1f %12.3f %16.1f\n", "offload", mb(offload->peak_rss), offload->step_s,
              offload->offloaded_mb);
  std::printf("peak RSS with offload / all resident: %.2fx; step time: %.2fx\n",
              mb(offload->peak_rss) / mb(resident->peak_rss), offload->step_s / resident->step_s);
  return 0;
}

// NOTE [staleness]: the modes' step times against the synchronous run's
// and against the ideal overlap of its generation and the rest.
int async_section(const std::string& root, int iterations, int hidden, int layers, int max_tokens) {
  // Apart, one compute thread per process, long responses (an untrained
  // policy rarely stops): generation and training can run side by side on
  // two cores, and generation is a large share of the synchronous step.
  const std::vector<std::string> apart = {
      "placement.mode=disaggregated",
      "placement.pools=[{name: train, devices: 1}, {name: gen, devices: 1}]",
      "placement.roles=[{role: rollout, pool: gen}]", "run.threads=1",
      "model.max_position_embeddings=160", "rl.generation.max_tokens=" + std::to_string(max_tokens),
      // The policy hardly changes (lr 1e-12, the update's compute all the same):
      // a learning policy shortens its responses, and a stale batch's are
      // an older policy's, so the modes would train on different work.
      "rl.actor_optim.lr=1e-12"};
  struct mode {
    const char* name;
    std::vector<std::string> sets;
  };
  const std::vector<mode> modes{
      {"synchronous", {"rl.staleness=0"}},
      {"staleness 1", {"rl.staleness=1"}},
      {"staleness 2", {"rl.staleness=2"}},
      {"staleness 1 in-flight", {"rl.staleness=1", "rl.inflight_updates=true"}},
      {"staleness 2 in-flight", {"rl.staleness=2", "rl.inflight_updates=true"}},
      // NOTE [paced rollout]: reproducible switch points, half a batch's
      // decode steps per batch ahead.
      {"staleness 2 paced (48)",
       {"rl.staleness=2", "rl.inflight_updates=true", "rl.inflight_steps=48"}},
  };
  std::vector<outcome> got;
  for (const auto& m : modes) {
    auto sets = apart;
    sets.insert(sets.end(), m.sets.begin(), m.sets.end());
    // Two batches ahead reach their steady state at iteration 3.
    auto r = run_once(root + "/" + std::to_string(got.size()), iterations, hidden, layers, sets, 2);
    if (!r) {
      std::fprintf(stderr, "bench_placement: %s: %s\n", m.name, describe(r.error()).c_str());
      return 1;
    }
    got.push_back(*r);
  }
  // Per 1000 trained tokens (outcome::step_s_per_kt).
  const double sync = got.front().step_s_per_kt, gen = got.front().gen_s_per_kt;
  const double rest = sync - gen, ideal = std::max(gen, rest);
  std::printf("\ndisaggregated (rollout | policy, critic, reference, reward), up to %d-token "
              "responses; seconds per 1000 trained tokens\n",
              max_tokens);
  std::printf("synchronous %.3f s: generation %.3f s + the rest %.3f s; ideal overlap %.3f s "
              "(%.2fx)\n",
              sync, gen, rest, ideal, ideal / sync);
  std::printf("%-24s %10s %10s %12s %18s\n", "", "step s", "s / kt", "vs sync", "share of ideal");
  for (size_t i = 0; i < modes.size(); ++i) {
    const double saving = sync - ideal;
    const double share = saving > 0 ? (sync - got[i].step_s_per_kt) / saving : 0;
    std::printf("%-24s %10.3f %10.3f %11.2fx %17.0f%%\n", modes[i].name, got[i].step_s,
                got[i].step_s_per_kt, got[i].step_s_per_kt / sync, 100 * share);
  }
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  int iterations = argc > 1 ? std::atoi(argv[1]) : 4;
  int hidden = argc > 2 ? std::atoi(argv[2]) : 512;
  int layers = argc > 3 ? std::atoi(argv[3]) : 6;
  const std::string which = argc > 4 ? argv[4] : "all";
  const int max_tokens = argc > 5 ? std::atoi(argv[5]) : 96;
  char tmpl[] = "/tmp/troupe-bench-placement-XXXXXX";
  if (!::mkdtemp(tmpl))
    return 1;
  std::string root = tmpl;
  int rc = 0;
  if (which == "all" || which == "offload")
    rc = offload_section(root, iterations, hidden, layers);
  if (rc == 0 && (which == "all" || which == "async"))
    rc = async_section(root, iterations, hidden, layers, max_tokens);
  std::filesystem::remove_all(root);
  return rc;
}
