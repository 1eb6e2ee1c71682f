// Jobs with their roles in worker processes (real `troupe worker`
// processes): co-located in one worker gives the in-process metrics exactly;
// disaggregated with policy and critic at DP 2 matches within 1e-5; a worker
// killed mid-run fails the job within 10 s naming the role, and no process
// is left behind.
#include "actors/actor_system.hpp"
#include "actors/rl/job.hpp"
#include "actors/rl/placement.hpp"
#include "cluster/role_host.hpp"
#include "tests/actors/job_yaml.hpp"
#include "tests/cluster/networked_system.hpp"
#include "tests/cluster/placed_runs.hpp"
#include "tests/cluster/same_learning.hpp"
#include "tests/support/temp_dir.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <thread>

#include <unistd.h>

using namespace troupe;
using namespace troupe::actors::rl;
using troupe::actors::rl::testing::parse_job;
using troupe::actors::rl::testing::tiny_job;

namespace {

const std::string disaggregated = troupe::actors::rl::testing::disaggregated_placement;

using test::launcher;
using test::run_placed;

bool process_gone(int64_t pid) { return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

} // namespace

TEST(Placement, ColocatedInOneWorkerGivesTheInProcessMetricsExactly) {
  test::temp_dir tmp;
  auto local = parse_job(tiny_job(tmp.file("local")));
  auto placed = parse_job(tiny_job(tmp.file("placed")), {"placement.mode=colocated"});
  ASSERT_TRUE(local && placed);
  auto a = run_placed(*local, tmp);
  ASSERT_TRUE(a) << describe(a.error());
  auto b = run_placed(*placed, tmp);
  ASSERT_TRUE(b) << describe(b.error());
  auto ma = test::metrics_of(local->run.dir), mb = test::metrics_of(placed->run.dir);
  ASSERT_EQ(ma.size(), 9u); // sft 3 + rm 2 + rl (step 0 + 3)
  EXPECT_EQ(ma, mb);
  // The worker wrote its log under the given folder.
  EXPECT_TRUE(std::filesystem::exists(tmp.file("logs") + "/worker-0.log"));
}

TEST(Placement, DisaggregatedWithDataParallelTrainersMatchesWithin1e5) {
  test::temp_dir tmp;
  auto local = parse_job(tiny_job(tmp.file("local")));
  auto placed = parse_job(tiny_job(tmp.file("placed"), "") + disaggregated);
  ASSERT_TRUE(local) << describe(local.error());
  ASSERT_TRUE(placed) << describe(placed.error());
  auto plan = make_plan(*placed);
  ASSERT_TRUE(plan) << describe(plan.error());
  EXPECT_EQ(plan->devices.size(), 4u);
  auto a = run_placed(*local, tmp);
  ASSERT_TRUE(a) << describe(a.error());
  auto b = run_placed(*placed, tmp);
  ASSERT_TRUE(b) << describe(b.error());
  test::expect_same_learning(test::metrics_of(local->run.dir), test::metrics_of(placed->run.dir));
}

// NOTE [training strategies]: the same job with the policy and the critic
// under zero1, zero2 and zero3 (each of the 2 ranks in its worker holding
// its shard; the checkpoints gather it; zero3's ranks gather the weights
// together for every pass and for the weight sync, which zero3 streams over
// a gloo broadcast a unit at a time: NOTE [streamed publish]) learns as the
// in-process run does.
TEST(Placement, ZeroTrainersAcrossWorkersMatchWithin1e5) {
  test::temp_dir tmp;
  auto local = parse_job(tiny_job(tmp.file("local")));
  ASSERT_TRUE(local) << describe(local.error());
  auto a = run_placed(*local, tmp);
  ASSERT_TRUE(a) << describe(a.error());
  for (std::string strategy : {"zero1", "zero2", "zero3"}) {
    SCOPED_TRACE(strategy);
    std::string placement = disaggregated;
    for (size_t at; (at = placement.find("dp: 2}")) != std::string::npos;)
      placement.replace(at, 6, "dp: 2, strategy: " + strategy + "}");
    std::vector<std::string> sets;
    if (strategy == "zero3")
      sets.push_back("weight_sync.transport=broadcast");
    auto placed = parse_job(tiny_job(tmp.file(strategy), "") + placement, sets);
    ASSERT_TRUE(placed) << describe(placed.error());
    auto b = run_placed(*placed, tmp);
    ASSERT_TRUE(b) << describe(b.error());
    test::expect_same_learning(test::metrics_of(local->run.dir), test::metrics_of(placed->run.dir));
  }
}

// The job with the policy and the critic placed by each layout's keys (in
// place of the disaggregated placement's dp 2, on that many train devices)
// learns as the in-process run does.
namespace {

struct trainer_layout {
  std::string name, keys;
  int devices;
};

void expect_layouts_learn_as_in_process(const std::vector<trainer_layout>& layouts) {
  test::temp_dir tmp;
  auto local = parse_job(tiny_job(tmp.file("local")));
  ASSERT_TRUE(local) << describe(local.error());
  auto a = run_placed(*local, tmp);
  ASSERT_TRUE(a) << describe(a.error());
  for (const auto& l : layouts) {
    SCOPED_TRACE(l.name);
    std::string placement = disaggregated;
    for (size_t at; (at = placement.find("dp: 2}")) != std::string::npos;)
      placement.replace(at, 6, l.keys + "}");
    placement.replace(placement.find("{name: train, devices: 2}"), 25,
                      "{name: train, devices: " + std::to_string(l.devices) + "}");
    auto placed = parse_job(tiny_job(tmp.file(l.name), "") + placement);
    ASSERT_TRUE(placed) << describe(placed.error());
    auto b = run_placed(*placed, tmp);
    ASSERT_TRUE(b) << describe(b.error());
    test::expect_same_learning(test::metrics_of(local->run.dir), test::metrics_of(placed->run.dir));
    // Rank 0 gathers its TP group's parts or receives a later stage's
    // tensors: its syncs report the largest of them beyond the copy.
    actors::rl::testing::expect_sync_staging(placed->run.dir, true);
  }
}

} // namespace

// NOTE [tensor parallelism]: at tp 2 each rank in its worker holds half of
// every block's heads and MLP rows and half of the vocabulary; the
// checkpoints save each rank's shard; the weight sync gathers the whole
// weights on rank 0 with its peer. Also dp 2 × tp 2 under zero1 over the
// DP dimension.
TEST(Placement, TensorParallelTrainersAcrossWorkersMatchWithin1e5) {
  expect_layouts_learn_as_in_process(
      {{"tp2", "tp: 2", 2}, {"dp2-tp2", "dp: 2, tp: 2, strategy: zero1", 4}});
}

// NOTE [pipeline parallelism]: at pp 2 each rank in its worker holds one
// layer (1F1B over 2 micro-batches); the checkpoints save each stage's
// shard; the weight sync gathers the whole weights on the first stage.
// Also tp 2 × pp 2.
TEST(Placement, PipelineParallelTrainersAcrossWorkersMatchWithin1e5) {
  expect_layouts_learn_as_in_process(
      {{"pp2", "pp: 2, pp_micro_batches: 2", 2}, {"tp2-pp2", "tp: 2, pp: 2", 4}});
}

TEST(Placement, ARolloutApartGetsItsWeightsByShmOrBroadcastAlike) {
  // The rollout in its own worker: weights cross processes through shared
  // memory (auto) or a gloo broadcast; either way the in-process run.
  test::temp_dir tmp;
  const std::string apart =
      "placement:\n  mode: hybrid\n  pools: [{name: a, devices: 1}, {name: b, devices: 1}]\n"
      "  roles: [{role: rollout, pool: b}]\n";
  const std::vector<std::string> sets = {"stages=[sft, rl]", "sft.eval_every=2"};
  auto local = parse_job(tiny_job(tmp.file("local")), sets);
  ASSERT_TRUE(local) << describe(local.error());
  ASSERT_TRUE(run_placed(*local, tmp));
  auto want = test::metrics_of(local->run.dir);
  for (std::string kind : {"auto", "broadcast"}) {
    auto s = sets;
    s.push_back("weight_sync.transport=" + kind);
    auto cfg = parse_job(tiny_job(tmp.file(kind)) + apart, s);
    ASSERT_TRUE(cfg) << describe(cfg.error());
    auto r = run_placed(*cfg, tmp);
    ASSERT_TRUE(r) << kind << ": " << describe(r.error());
    EXPECT_EQ(test::metrics_of(cfg->run.dir), want) << kind;
  }
}

// NOTE [rollout group]: the rollout at tp 2 — co-located (its rank 0 in
// the policy's worker, rank 1 in the other) and apart (each rank in its
// own worker of a pool of 2 devices), the ranks summing through shared
// memory across the processes and each receiving the policy's weights by
// shm — learns as one rollout does (the model's one kv head is replicated
// on both ranks, its two query heads split).
TEST(Placement, ATensorParallelRolloutLearnsAsOneRolloutDoes) {
  test::temp_dir tmp;
  auto local = parse_job(tiny_job(tmp.file("local")));
  ASSERT_TRUE(local) << describe(local.error());
  ASSERT_TRUE(run_placed(*local, tmp));
  const std::string colocated = "placement:\n  mode: colocated\n  pools: [{name: a, devices: 2}]\n"
                                "  roles: [{role: rollout, pool: a, tp: 2}]\n";
  const std::string apart =
      "placement:\n  mode: hybrid\n  pools: [{name: a, devices: 1}, {name: b, devices: 2}]\n"
      "  roles: [{role: rollout, pool: b, tp: 2}]\n";
  for (const auto& [name, placement] : std::vector<std::pair<std::string, std::string>>{
           {"colocated", colocated}, {"apart", apart}}) {
    SCOPED_TRACE(name);
    auto cfg = parse_job(tiny_job(tmp.file(name), "") + placement);
    ASSERT_TRUE(cfg) << describe(cfg.error());
    auto plan = make_plan(*cfg);
    ASSERT_TRUE(plan) << describe(plan.error());
    EXPECT_NE(plan->render().find("weights: policy → rollout by shm"), std::string::npos)
        << plan->render();
    auto r = run_placed(*cfg, tmp);
    ASSERT_TRUE(r) << describe(r.error());
    // NOTE [decode path report]: the replicated kv head takes the ATen
    // path on each rank, and the job's metrics say so.
    auto want = test::metrics_of(local->run.dir), got = test::metrics_of(cfg->run.dir);
    double aten = 0;
    for (auto* lines : {&want, &got})
      for (auto& line : *lines) {
        if (lines == &got && line.contains("rollout/aten_decode_steps"))
          aten += line["rollout/aten_decode_steps"].get<double>();
        line.erase("rollout/aten_decode_steps");
      }
    EXPECT_GT(aten, 0);
    test::expect_same_learning(want, got);
  }
}

TEST(Placement, KillingAWorkerFailsTheJobNamingTheRoleWithin10s) {
  test::temp_dir tmp;
  // The rollout alone in worker 1; everything else in worker 0.
  auto cfg = parse_job(tiny_job(tmp.file("run"), "") +
                           "placement:\n"
                           "  mode: hybrid\n"
                           "  pools: [{name: a, devices: 1}, {name: b, devices: 1}]\n"
                           "  roles: [{role: rollout, pool: b}]\n",
                       // Without restarts (NOTE [supervision]): the loss fails the job.
                       {"rl.iterations=100000", "stages=[rl]", "rl.eval_every=0",
                        "rl.critic.init=base", "supervision.budget=0"});
  ASSERT_TRUE(cfg) << describe(cfg.error());
  auto plan = make_plan(*cfg);
  ASSERT_TRUE(plan) << describe(plan.error());
  test::networked_system ns;
  auto host = cluster::worker_host::launch(*ns.sys, *plan, launcher(tmp));
  ASSERT_TRUE(host) << describe(host.error());
  std::vector<int64_t> pids;
  for (const auto& w : (*host)->workers())
    pids.push_back(w.pid);
  ASSERT_EQ(pids.size(), 2u);
  run_options opts;
  opts.host = host->get();
  auto job = std::async(std::launch::async, [&] { return run_job(*ns.sys, *cfg, opts); });
  // Wait until the RL loop runs (a few iterations logged).
  for (int i = 0; i < 600; ++i) {
    if (test::metrics_of(cfg->run.dir).size() >= 3)
      break;
    ASSERT_NE(job.wait_for(std::chrono::milliseconds(50)), std::future_status::ready)
        << "the job ended before the kill";
  }
  ASSERT_GE(test::metrics_of(cfg->run.dir).size(), 3u);
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(static_cast<pid_t>(pids[1]), SIGKILL), 0);
  ASSERT_EQ(job.wait_for(std::chrono::seconds(10)), std::future_status::ready)
      << "the job did not fail within 10 s of the kill";
  auto waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto r = job.get();
  ASSERT_FALSE(r);
  auto msg = describe(r.error());
  EXPECT_NE(msg.find("rollout"), std::string::npos) << msg;
  EXPECT_NE(msg.find("worker 1"), std::string::npos) << msg;
  EXPECT_LT(waited, 10.0);
  auto died = (*host)->check();
  ASSERT_TRUE(died);
  EXPECT_NE(describe(died).find("killed by signal 9"), std::string::npos) << describe(died);
  EXPECT_NE(describe(died).find("rollout"), std::string::npos) << describe(died);
  host->reset(); // stops what is left
  for (auto pid : pids)
    EXPECT_TRUE(process_gone(pid)) << "pid " << pid << " survived";
}
