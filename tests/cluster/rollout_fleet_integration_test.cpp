// NOTE [rollout fleet]: the rollout at dp 2 — two engines, each in its own
// `troupe worker` process, the prompts split between them — in real jobs:
// at bound 0 with in-flight updates on, the run equals the one-engine
// synchronous run bit for bit (true_on_policy: batch-invariant kernels);
// with staleness 2 and in-flight updates, every token is within the bound
// and the job learns on; with staleness 2, a stopped and resumed run is the
// uninterrupted one.
#include "actors/actor_system.hpp"
#include "actors/rl/job.hpp"
#include "actors/rl/placement.hpp"
#include "cluster/role_host.hpp"
#include "runtime/checkpoint.hpp"
#include "runtime/file_io.hpp"
#include "tests/actors/job_runs.hpp"
#include "tests/actors/job_yaml.hpp"
#include "tests/cluster/networked_system.hpp"
#include "tests/cluster/placed_runs.hpp"
#include "tests/cluster/same_learning.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <string>
#include <vector>

using namespace troupe;
using namespace troupe::actors::rl;
using troupe::actors::rl::testing::parse_job;
using troupe::actors::rl::testing::tiny_job;

namespace {

// Two rollout replicas, one in each of the pool's two workers.
const std::string fleet = "placement:\n  mode: colocated\n  pools: [{name: a, devices: 2}]\n"
                          "  roles: [{role: rollout, pool: a, dp: 2}]\n";

using test::launcher;
using test::run_placed;

// A metrics line without the engine's own gauges and step counts (a
// fleet's KV pools and prefix caches are two, each with its share of the
// work, and each steps: two engines take twice the decode steps).
nlohmann::json without_engine_gauges(nlohmann::json j) {
  for (const char* k :
       {"rollout/kv_utilization", "rollout/prefix_hit_rate", "rollout/aten_decode_steps"})
    j.erase(k);
  return j;
}

} // namespace

TEST(RolloutFleet, BoundZeroWithTwoEnginesAndInflightUpdatesIsTheSynchronousRunBitForBit) {
  test::temp_dir tmp;
  const std::vector<std::string> sets{"rl.true_on_policy=true", "rl.samples_per_prompt=2"};
  auto one = parse_job(tiny_job(tmp.file("one")), sets);
  auto sets_fleet = sets;
  sets_fleet.push_back("rl.inflight_updates=true");
  auto two = parse_job(tiny_job(tmp.file("two")) + fleet, sets_fleet);
  ASSERT_TRUE(one) << describe(one.error());
  ASSERT_TRUE(two) << describe(two.error());
  auto plan = make_plan(*two);
  ASSERT_TRUE(plan) << describe(plan.error());
  ASSERT_NE(plan->find("rollout"), nullptr);
  EXPECT_EQ(plan->layout_of("rl", "rollout").ranks(), 2) << plan->render();
  EXPECT_NE(plan->device_of("rollout", 0), plan->device_of("rollout", 1))
      << "a replica in each worker";
  auto a = run_placed(*one, tmp);
  ASSERT_TRUE(a) << describe(a.error());
  auto b = run_placed(*two, tmp);
  ASSERT_TRUE(b) << describe(b.error());
  auto ma = test::metrics_of(one->run.dir), mb = test::metrics_of(two->run.dir);
  ASSERT_EQ(ma.size(), mb.size());
  ASSERT_GT(ma.size(), 3u);
  for (size_t i = 0; i < ma.size(); ++i)
    EXPECT_EQ(without_engine_gauges(ma[i]), without_engine_gauges(mb[i])) << "line " << i;
  auto wa = runtime::read_file(tmp.file("one") + "/rl/model/model.safetensors");
  auto wb = runtime::read_file(tmp.file("two") + "/rl/model/model.safetensors");
  ASSERT_TRUE(wa && wb);
  EXPECT_TRUE(*wa == *wb) << "the final weights differ";
}

TEST(RolloutFleet, StalenessTwoWithInflightUpdatesKeepsEveryTokenWithinTheBound) {
  test::temp_dir tmp;
  auto cfg = parse_job(tiny_job(tmp.file("run")) + fleet,
                       {"rl.iterations=5", "rl.staleness=2", "rl.inflight_updates=true",
                        "rl.generation.max_tokens=12", "rl.eval_every=0"});
  ASSERT_TRUE(cfg) << describe(cfg.error());
  auto r = run_placed(*cfg, tmp);
  ASSERT_TRUE(r) << describe(r.error());
  std::vector<nlohmann::json> rl;
  for (const auto& j : test::metrics_of(cfg->run.dir))
    if (j["stage"] == "rl" && j["step"].get<int>() > 0)
      rl.push_back(j);
  ASSERT_EQ(rl.size(), 5u);
  for (size_t i = 0; i < rl.size(); ++i) {
    const auto& j = rl[i];
    const auto bound = static_cast<double>(std::min<size_t>(i, 2));
    EXPECT_LE(j["rollout/staleness/max"].get<double>(), bound) << "step " << i + 1;
    double sum = 0;
    for (int d = 0; d <= 2; ++d)
      sum += j["rollout/staleness/frac_" + std::to_string(d)].get<double>();
    EXPECT_NEAR(sum, 1.0, 1e-9);
    EXPECT_FALSE(j.contains("timing_s/gen_wait"));
    EXPECT_TRUE(std::isfinite(j["actor/pg_loss"].get<double>()));
  }
}

namespace {

// The fleet job with `sets` run straight (in tmp/a) and stopped after
// iteration 2, then resumed (in tmp/b): the same metrics, line for line,
// and the same final weights. Answers the straight run's metrics lines.
std::vector<nlohmann::json> expect_fleet_resume_exact(const test::temp_dir& tmp,
                                                      const std::vector<std::string>& sets,
                                                      const char* saved_file) {
  auto straight = parse_job(tiny_job(tmp.file("a")) + fleet, sets);
  auto split = parse_job(tiny_job(tmp.file("b")) + fleet, sets);
  EXPECT_TRUE(straight && split);
  if (!straight || !split)
    return {};
  auto a = run_placed(*straight, tmp);
  EXPECT_TRUE(a) << describe(a.error());
  std::atomic<bool> stop{false};
  auto b1 = run_placed(*split, tmp, troupe::actors::rl::testing::stop_after_rl_step(stop, 2));
  EXPECT_TRUE(b1) << describe(b1.error());
  EXPECT_TRUE(b1 && b1->stopped);
  auto latest = runtime::latest_checkpoint(tmp.file("b") + "/rl/checkpoints");
  auto files = latest ? runtime::read_checkpoint(*latest)
                      : expected<runtime::checkpoint_files>{latest.error()};
  EXPECT_TRUE(files && files->count(saved_file)) << saved_file;
  run_options second;
  second.resume = true;
  auto b2 = run_placed(*split, tmp, second);
  EXPECT_TRUE(b2) << describe(b2.error());
  EXPECT_TRUE(b2 && !b2->stopped);
  auto ma = test::metrics_of(tmp.file("a")), mb = test::metrics_of(tmp.file("b"));
  EXPECT_EQ(ma.size(), mb.size());
  for (size_t i = 0; i < std::min(ma.size(), mb.size()); ++i)
    EXPECT_EQ(ma[i], mb[i]) << "line " << i;
  auto wa = runtime::read_file(tmp.file("a") + "/rl/model/model.safetensors");
  auto wb = runtime::read_file(tmp.file("b") + "/rl/model/model.safetensors");
  EXPECT_TRUE(wa && wb && *wa == *wb) << "the final weights differ";
  return ma;
}

} // namespace

// NOTE [staleness]: two batches ahead over two engines, stopped after
// iteration 2 and resumed: the checkpoint's batches sampled ahead make the
// resumed run the uninterrupted one, metric for metric and bit for bit.
TEST(RolloutFleet, StalenessTwoOverTwoEnginesResumesExactly) {
  test::temp_dir tmp;
  auto lines = expect_fleet_resume_exact(
      tmp, {"rl.iterations=5", "rl.staleness=2", "rl.checkpoint_every=0"}, "ahead_batches.bin");
  EXPECT_GT(lines.size(), 5u);
}

// NOTE [paced rollout]: staleness 2 over two engines with in-flight
// updates at a pace of 3 steps (batch-invariant kernels), stopped after
// iteration 2 — each replica's batches ahead saved mid-generation — and
// resumed, is the uninterrupted run, metric for metric and bit for bit.
TEST(RolloutFleet, PacedInflightUpdatesOverTwoEnginesResumeExactly) {
  test::temp_dir tmp;
  auto lines = expect_fleet_resume_exact(
      tmp,
      {"rl.iterations=5", "rl.checkpoint_every=0", "rl.staleness=2", "rl.inflight_updates=true",
       "rl.inflight_steps=3", "rl.generation.max_tokens=12", "rl.rollout.batch_invariant=true"},
      "rollout_ahead.bin");
  bool mixed = false;
  for (const auto& j : lines)
    if (j.contains("rollout/staleness/frac_0")) {
      auto f0 = j["rollout/staleness/frac_0"].get<double>();
      mixed = mixed || (f0 > 0 && f0 < 1);
    }
  EXPECT_TRUE(mixed) << "a batch ahead spans a version switch";
}
