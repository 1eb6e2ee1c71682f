// The placement planner: devices, DP ranks and memory estimates of a job,
// and every rule it checks before anything starts.
#include "actors/rl/placement.hpp"
#include "tests/actors/job_yaml.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <unistd.h>

using namespace troupe;
using namespace troupe::actors::rl;
using troupe::actors::rl::testing::parse_job;
using troupe::actors::rl::testing::tiny_job;

namespace {

// The term `name` of `rank`'s estimate at its device's peak (-1: none).
double term(const placement_plan& plan, const std::string& rank, const std::string& name) {
  for (const auto& d : plan.devices)
    for (const auto& r : d.peak_ranks)
      if (r.rank == rank)
        for (const auto& t : r.terms)
          if (t.name == name)
            return t.bytes;
  return -1.0;
}

double weights(const placement_plan& plan, const std::string& rank) {
  return term(plan, rank, "weights");
}

std::string error_of(const std::string& extra, std::vector<std::string> sets = {}) {
  auto c = parse_job(tiny_job("run", "") + extra, std::move(sets));
  EXPECT_FALSE(c);
  return c ? std::string{} : describe(c.error());
}

} // namespace

TEST(Placement, InProcessByDefault) {
  auto c = parse_job(tiny_job("run"));
  ASSERT_TRUE(c) << describe(c.error());
  auto p = make_plan(*c);
  ASSERT_TRUE(p) << describe(p.error());
  EXPECT_FALSE(p->uses_workers());
  EXPECT_GT(p->driver_peak_bytes, 16.0 * static_cast<double>(p->parameters)); // at least the policy's state
  EXPECT_EQ(p->dp_of("rl", "policy"), 1);
}

TEST(Placement, ColocatedPutsEveryRoleOnOneDevice) {
  auto c = parse_job(tiny_job("run"), {"placement.mode=colocated"});
  ASSERT_TRUE(c) << describe(c.error());
  auto p = make_plan(*c);
  ASSERT_TRUE(p) << describe(p.error());
  ASSERT_EQ(p->devices.size(), 1u);
  EXPECT_EQ(p->worker_labels(), std::vector<std::string>{"all:policy+critic+reference+reward+rollout"});
  for (const auto& r : p->roles)
    EXPECT_EQ(r.devices, std::vector<int64_t>{0}) << r.role;
}

TEST(Placement, DisaggregatedLaysPoolsOutInOrderWithDpRanks) {
  auto c = parse_job(tiny_job("run") +
                     "placement:\n  mode: disaggregated\n"
                     "  pools: [{name: train, devices: 2}, {name: gen, devices: 1}]\n"
                     "  roles: [{role: policy, pool: train, dp: 2}, {role: critic, pool: train},\n"
                     "          {role: rollout, pool: gen}]\n");
  ASSERT_TRUE(c) << describe(c.error());
  auto p = make_plan(*c);
  ASSERT_TRUE(p) << describe(p.error());
  ASSERT_EQ(p->devices.size(), 3u);
  EXPECT_EQ(p->find("policy")->devices, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(p->find("critic")->devices, std::vector<int64_t>{0});
  EXPECT_EQ(p->find("rollout")->devices, std::vector<int64_t>{2});
  EXPECT_EQ(p->find("reward")->pool, "train"); // not listed: the first pool
  EXPECT_EQ(p->dp_of("rl", "policy"), 2);
  EXPECT_EQ(p->dp_of("sft", "rollout"), 1);
  // Device 0 holds policy rank 0, the critic, reference and reward: the most.
  EXPECT_GT(p->devices[0].peak_bytes, p->devices[1].peak_bytes);
  EXPECT_GT(p->devices[1].peak_bytes, 0.0);
  auto text = p->render();
  EXPECT_NE(text.find("device 1 (pool train): policy[dp 1]"), std::string::npos) << text;
  EXPECT_NE(text.find("policy: pool train, dp 2, devices [0, 1]"), std::string::npos) << text;
}

TEST(Placement, ChecksRolesPoolsAndDivisibility) {
  const std::string pools = "placement:\n  mode: hybrid\n  pools: [{name: a, devices: 2}, {name: b, devices: 1}]\n";
  auto e = error_of(pools + "  roles: [{role: policy, pool: b, dp: 2}]\n");
  EXPECT_NE(e.find("placement.roles[0].dp: dp 2 must divide the 1 devices of pool 'b'"), std::string::npos) << e;
  e = error_of(pools + "  roles: [{role: critic, pool: a, dp: 2}]\n", {"rl.minibatches=4"}); // 4 rows / 4 = 1
  EXPECT_NE(e.find("dp 2 must divide the rl minibatch"), std::string::npos) << e;
  e = error_of(pools + "  roles: [{role: reference, pool: a, dp: 2}]\n");
  EXPECT_NE(e.find("reference has one rank"), std::string::npos) << e;
  e = error_of(pools + "  roles: [{role: actor, pool: c}]\n");
  EXPECT_NE(e.find("placement.roles[0].role: expected one of"), std::string::npos) << e;
  EXPECT_NE(e.find("placement.roles[0].pool: no pool named 'c'"), std::string::npos) << e;
  e = error_of(pools + "  roles: [{role: policy, pool: a}, {role: policy, pool: b}]\n");
  EXPECT_NE(e.find("role 'policy' is placed twice"), std::string::npos) << e;
  e = error_of("", {"placement.mode=colocated", "placement.pools=[{name: a}, {name: b}]"});
  EXPECT_NE(e.find("colocated places every role in one pool, got 2"), std::string::npos) << e;
  e = error_of("", {"placement.mode=disaggregated", "placement.pools=[{name: a}, {name: b}]"});
  EXPECT_NE(e.find("disaggregated: policy and rollout share pool 'a'"), std::string::npos) << e;
  e = error_of("", {"placement.pools=[{name: a}]"});
  EXPECT_NE(e.find("placement.pools: in_process runs no workers"), std::string::npos) << e;
  e = error_of("", {"placement.mode=colocated", "resources.devices_per_node=0", "resources.nodes=2"});
  EXPECT_NE(e.find("resources.nodes: 2 nodes, but the pools' 1 devices at 1 per node fill only 1"),
            std::string::npos)
      << e;
  e = error_of("", {"resources.nodes=2"});
  EXPECT_NE(e.find("resources.nodes: in_process runs every role in the driver's process"), std::string::npos) << e;
  e = error_of("", {"resources.launcher=nodes"});
  EXPECT_NE(e.find("resources.launcher: nodes start worker processes"), std::string::npos) << e;
  e = error_of(pools, {"resources.devices_per_node=2"});
  EXPECT_NE(e.find("the pools need 3 devices, resources give 2"), std::string::npos) << e;
  // Errors point at the YAML line of the path.
  e = error_of(pools + "  roles: [{role: policy, pool: b, dp: 2}]\n");
  EXPECT_NE(e.find("job.yaml:"), std::string::npos) << e;
}

TEST(Placement, RefusesADeviceThatDoesNotFit) {
  auto c = parse_job(tiny_job("run"), {"placement.mode=colocated", "resources.device_memory_gb=0.0001"});
  ASSERT_TRUE(c) << describe(c.error());
  auto p = make_plan(*c);
  ASSERT_FALSE(p);
  auto e = describe(p.error());
  EXPECT_NE(e.find("device 0 (pool all: policy, critic, reference, reward, rollout) needs an estimated"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("resources.device_memory_gb"), std::string::npos) << e;
  EXPECT_NE(e.find("the largest term is "), std::string::npos) << e;
}

TEST(Placement, RefusesAnInProcessJobLargerThanTheMachine) {
  // 3.6e12 parameters: far beyond any host; refused by the plan, before spawning.
  auto c = parse_job(tiny_job("run"), {"model.hidden_size=65536", "model.intermediate_size=196608",
                                       "model.num_layers=64", "model.num_heads=64",
                                       "model.num_kv_heads=64"});
  ASSERT_TRUE(c) << describe(c.error());
  auto p = make_plan(*c);
  ASSERT_FALSE(p);
  auto e = describe(p.error());
  EXPECT_NE(e.find("the driver's process needs an estimated"), std::string::npos) << e;
  EXPECT_NE(e.find("more than this machine's"), std::string::npos) << e;
  // Its largest term: the policy's AdamW moments (8 bytes a parameter).
  EXPECT_NE(e.find("the largest term is policy's optimizer state"), std::string::npos) << e;
  // The same job fits when the machine is declared large enough.
  auto big = parse_job(tiny_job("run"), {"model.hidden_size=64", "resources.device_memory_gb=1"});
  ASSERT_TRUE(big);
  EXPECT_TRUE(make_plan(*big));
}

namespace {

const char* two_pools = "placement:\n  mode: disaggregated\n"
                        "  pools: [{name: train, devices: 2}, {name: gen, devices: 1}, {name: judge, devices: 1}]\n"
                        "  roles: [{role: policy, pool: train, dp: 2}, {role: rollout, pool: gen},\n"
                        "          {role: reward, pool: judge}, {role: reference, pool: judge}]\n";

expected<placement_plan> plan_of(const std::string& extra, std::vector<std::string> sets) {
  auto c = parse_job(tiny_job("run") + extra, std::move(sets));
  if (!c)
    return c.error();
  return make_plan(*c);
}

} // namespace

TEST(Placement, DevicesFillTheNodesInPoolOrder) {
  auto p = plan_of(two_pools, {"resources.nodes=2"});
  ASSERT_TRUE(p) << describe(p.error());
  EXPECT_EQ(p->nodes, 2);
  std::vector<int64_t> nodes;
  for (const auto& d : p->devices)
    nodes.push_back(d.node);
  EXPECT_EQ(nodes, (std::vector<int64_t>{0, 0, 1, 1})) << "2 per node: the trainers, then rollout and judges";
  EXPECT_EQ(p->devices_per_node(), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(p->weight_transport, runtime::transport_kind::broadcast) << "across nodes without a shared dir";
  auto shown = p->render();
  EXPECT_NE(shown.find("node 1:\n    device 2 (pool gen): rollout"), std::string::npos) << shown;
  EXPECT_NE(shown.find("weights: policy → rollout by broadcast"), std::string::npos) << shown;

  p = plan_of(two_pools, {"resources.nodes=4", "resources.devices_per_node=1"});
  ASSERT_TRUE(p) << describe(p.error());
  EXPECT_EQ(p->devices_per_node(), (std::vector<int64_t>{1, 1, 1, 1}));
  p = plan_of(two_pools, {"resources.nodes=3"});
  ASSERT_FALSE(p) << "4 devices, 2 per node: a third node would hold none";
  EXPECT_NE(describe(p.error()).find("fill only 2"), std::string::npos) << describe(p.error());
  p = plan_of(two_pools, {"resources.nodes=2", "weight_sync.dir=/shared/weights"});
  ASSERT_TRUE(p) << describe(p.error());
  EXPECT_EQ(p->weight_transport, runtime::transport_kind::disk) << "a directory both nodes see";
}

TEST(Placement, TheWeightTransportFitsThePairAndImpossibleChoicesAreRefused) {
  // auto: one process alias, one node shm.
  auto p = plan_of("", {});
  ASSERT_TRUE(p) << describe(p.error());
  EXPECT_EQ(p->weight_transport, runtime::transport_kind::alias);
  p = plan_of(two_pools, {});
  ASSERT_TRUE(p) << describe(p.error());
  EXPECT_EQ(p->weight_transport, runtime::transport_kind::shm);
  p = plan_of("", {"stages=[sft, rm]"});
  ASSERT_TRUE(p) << describe(p.error());
  EXPECT_EQ(p->weight_transport, std::nullopt) << "no rl stage, no weight sync";

  auto refused = [&](std::vector<std::string> sets) {
    auto q = plan_of(two_pools, std::move(sets));
    EXPECT_FALSE(q);
    return q ? std::string{} : describe(q.error());
  };
  auto e = refused({"weight_sync.transport=alias"});
  EXPECT_NE(e.find("weight_sync.transport alias: the policy (device 0 on node 0) and the rollout (device 2 on "
                   "node 0) are in different processes"),
            std::string::npos)
      << e;
  e = refused({"resources.nodes=2", "weight_sync.transport=shm"});
  EXPECT_NE(e.find("the rollout (device 2 on node 1) are on different nodes, and shared memory stays on one"),
            std::string::npos)
      << e;
  e = refused({"resources.nodes=2", "weight_sync.transport=disk"});
  EXPECT_NE(e.find("set weight_sync.dir to a directory both see"), std::string::npos) << e;
  // cuda_ipc is a choice of the file; CPU roles (or a build without CUDA) cannot use it.
  e = refused({"weight_sync.transport=cuda_ipc"});
  EXPECT_NE(e.find("weight_sync.transport cuda_ipc: "), std::string::npos) << e;
  EXPECT_TRUE(e.find("CPU tensors") != std::string::npos || e.find("no CUDA") != std::string::npos) << e;
  // What can work is kept.
  for (std::string t : {"broadcast", "shm", "disk"}) {
    auto ok = plan_of(two_pools, {"weight_sync.transport=" + t});
    ASSERT_TRUE(ok) << t << ": " << describe(ok.error());
    EXPECT_EQ(ok->weight_transport, enum_from_name<runtime::transport_kind>(t));
  }
}

// NOTE [parallel layout]: the keys of the coming engines are part of the
// file now; each is refused, with its YAML path, until its engine lands.
TEST(Placement, LayoutKeysNotYetAvailableAreRefusedWithTheirPath) {
  const std::string pools = "placement:\n  mode: hybrid\n  pools: [{name: a, devices: 4}, {name: b, devices: 1}]\n";
  auto ok = plan_of(pools + "  roles: [{role: policy, pool: a, dp: 2, tp: 1, pp: 1, strategy: ddp, "
                            "micro_batch_rows: 0}]\n",
                    {});
  ASSERT_TRUE(ok) << describe(ok.error());
  EXPECT_EQ(ok->layout_of("rl", "policy"), (parallel_layout{2, 1, 1}));
  EXPECT_EQ(ok->layout_of("rl", "reference"), parallel_layout{}) << "frozen: one rank";
  // zero1 is built (NOTE [training strategies]).
  ok = plan_of(pools + "  roles: [{role: policy, pool: a, dp: 2, strategy: zero1}]\n", {});
  ASSERT_TRUE(ok) << describe(ok.error());
  // A ZeRO strategy with dp 1 is accepted, with a warning naming where.
  ok = plan_of(pools + "  roles: [{role: policy, pool: a, strategy: zero3}]\n", {});
  ASSERT_TRUE(ok) << describe(ok.error());
  ASSERT_EQ(ok->warnings.size(), 1u);
  EXPECT_EQ(ok->warnings[0], "placement.roles[0].strategy: zero3 with dp 1 has nothing to shard: "
                             "policy trains as ddp does");
  EXPECT_NE(ok->render().find("warning: placement.roles[0].strategy: zero3 with dp 1"),
            std::string::npos);
  // So are a rollout's replicas (NOTE [rollout fleet]): each holds the whole
  // model, and a one-receiver transport cannot reach them all.
  auto fleet = plan_of(pools + "  roles: [{role: rollout, pool: a, dp: 2}]\n", {});
  ASSERT_TRUE(fleet) << describe(fleet.error());
  EXPECT_EQ(fleet->find("rollout")->layout.dp, 2);
  EXPECT_EQ(fleet->layout_of("rl", "rollout").ranks(), 2);
  auto one_receiver = plan_of(pools + "  roles: [{role: rollout, pool: a, dp: 2}]\n",
                              {"weight_sync.transport=broadcast"});
  ASSERT_FALSE(one_receiver);
  EXPECT_NE(describe(one_receiver.error()).find("the rollout (2 ranks) has several ranks"),
            std::string::npos);
  // So are micro-batches that divide a rank's share (NOTE [micro-batches]).
  ok = plan_of(pools + "  roles: [{role: policy, pool: a, dp: 2, micro_batch_rows: 2}]\n", {});
  ASSERT_TRUE(ok) << describe(ok.error());
  struct row {
    std::string role;
    std::string expected;
  };
  for (const auto& [role, expected] : std::vector<row>{
           {"{role: reference, pool: a, tp: 2}",
            "job.yaml:18:42: placement.roles[0].tp: tensor parallelism is for trained roles "
            "(policy, critic, reward) and the rollout; reference's is not available yet"},
           {"{role: rollout, pool: a, tp: 4}", // NOTE [rollout group]
            "job.yaml:18:40: placement.roles[0].tp: tensor parallelism: tp 4 does not divide the "
            "attention heads (2)"},
           {"{role: policy, pool: a, tp: 4}", // tiny_job: 2 heads
            "job.yaml:18:39: placement.roles[0].tp: tensor parallelism: tp 4 does not divide the "
            "attention heads (2)"},
           {"{role: policy, pool: a, pp: 3}", // tiny_job: 2 layers
            "job.yaml:18:39: placement.roles[0].pp: pipeline parallelism: pp 3 over 2 layers: "
            "more stages than layers"},
           {"{role: policy, pool: a, pp: 2, pp_micro_batches: 1}",
            "placement.roles[0].pp_micro_batches: 1 micro-batches are fewer than the 2 stages"},
           {"{role: policy, pool: a, pp: 2, pp_layers: [1, 2]}",
            "placement.roles[0].pp_layers: pipeline parallelism: pp 2 over 2 layers: pp_layers "
            "sum to 3"},
           {"{role: policy, pool: a, pp_layers: [2]}",
            "placement.roles[0].pp_layers: lists the layers of each pipeline stage: give pp > 1"},
           {"{role: rollout, pool: a, pp: 2}",
            "placement.roles[0].pp: pipeline parallelism is for trained roles (policy, critic, "
            "reward); rollout's is not available yet"},
           {"{role: reference, pool: a, strategy: zero1}",
            "job.yaml:18:48: placement.roles[0].strategy: zero1 shards training state, and "
            "reference "
            "is not trained"},
           {"{role: policy, pool: a, micro_batch_rows: 7}",
            "job.yaml:18:53: placement.roles[0].micro_batch_rows: 7 does not divide a rank's share "
            "of the "},
           {"{role: policy, pool: a, tp: 0}", "placement.roles[0].tp: must be >= 1"},
           {"{role: policy, pool: a, micro_batch_rows: 2, micro_batch_tokens: 64}",
            "placement.roles[0].micro_batch_tokens: give micro_batch_rows or micro_batch_tokens, "
            "not both"},
           {"{role: policy, pool: a, micro_batch_tokens: -1}",
            "placement.roles[0].micro_batch_tokens: must be >= 0"},
           {"{role: policy, pool: a, strategy: zero9}",
            "placement.roles[0].strategy: expected one of ddp, zero1, zero2, zero3, got 'zero9'"},
       }) {
    auto e = error_of(pools + "  roles: [" + role + "]\n");
    EXPECT_NE(e.find(expected), std::string::npos) << role << "\n" << e;
  }
}

// NOTE [tensor parallelism]: a TP rank holds its part of the parameters
// (tiny_job at tp 2: half of each block's heads and MLP rows, half the
// vocabulary, the kv head and the norms whole), its ranks are named by
// their mesh coordinates, and a TP group that would span nodes is refused.
TEST(Placement, TensorParallelRanksHoldTheirPartOnOneNode) {
  auto with = [](const std::string& layout, std::vector<std::string> sets = {}) {
    std::string p = troupe::actors::rl::testing::disaggregated_placement;
    p.replace(p.find("{role: policy, pool: train, dp: 2}"), 34,
              "{role: policy, pool: train, " + layout + "}");
    return plan_of(p, std::move(sets));
  };
  auto dp = with("dp: 2"), tp = with("tp: 2");
  ASSERT_TRUE(dp) << describe(dp.error());
  ASSERT_TRUE(tp) << describe(tp.error());
  EXPECT_EQ(tp->layout_of("rl", "policy"), (parallel_layout{1, 2, 1}));
  EXPECT_EQ(tp->find("policy")->devices, (std::vector<int64_t>{0, 1}));
  // tiny_job: H 32, I 64, 2 layers, 2 heads of 16, 1 kv head, vocab 259.
  const double layer = 32 * 16 + 2 * 32 * 16 + 16 * 32 + 3 * 32 * 32 + 2 * 32;
  const double rest = 130 * 32 * 2 + 32; // embedding and LM head parts (130 of 259 ids), norm
  EXPECT_DOUBLE_EQ(weights(*tp, "policy[dp 0, tp 1]"), 4 * (2 * layer + rest));
  EXPECT_LT(weights(*tp, "policy[dp 0, tp 0]"), weights(*dp, "policy[dp 0]"));
  EXPECT_NE(tp->render().find("policy[dp 0, tp 1]"), std::string::npos) << tp->render();
  // Each rank's share of the TP group's shared segment (NOTE [shm
  // all-reduce]: a flag line and two 4 MiB slots a rank); none at DP.
  EXPECT_DOUBLE_EQ(term(*tp, "policy[dp 0, tp 1]", "TP shared-memory sums (its share)"),
                   64 + 2 * 4 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(term(*dp, "policy[dp 0]", "TP shared-memory sums (its share)"), -1);
  // Two nodes of two devices, policy at tp 2 on devices 1 and 2: refused.
  std::string apart = "placement:\n  mode: hybrid\n  pools: [{name: a, devices: 1}, {name: b, "
                      "devices: 2}, {name: c, devices: 1}]\n"
                      "  roles: [{role: policy, pool: b, tp: 2}]\n";
  auto split = plan_of(apart, {"resources.nodes=2", "resources.devices_per_node=2"});
  ASSERT_FALSE(split);
  EXPECT_NE(describe(split.error())
                .find("policy's tensor-parallel group 0 (tp 2) spans nodes 0 and 1; a TP group "
                      "stays on one node"),
            std::string::npos)
      << describe(split.error());
}

// NOTE [rollout group]: a TP rollout rank holds its part of the weights
// (the policy's parts at tp 2), its ranks are named by TP coordinate, the
// policy's weights reach it by a channel every rank receives from, and a
// forced broadcast (one receiver) or a rollout on another node with no
// shared folder is refused before launch.
TEST(Placement, ATensorParallelRolloutRankHoldsItsPartAndReceivesByAChannelForMany) {
  const std::string pools =
      "placement:\n  mode: hybrid\n  pools: [{name: a, devices: 1}, {name: b, devices: 2}]\n";
  auto one = plan_of(pools + "  roles: [{role: rollout, pool: b}]\n", {});
  auto two = plan_of(pools + "  roles: [{role: rollout, pool: b, tp: 2}]\n", {});
  ASSERT_TRUE(one) << describe(one.error());
  ASSERT_TRUE(two) << describe(two.error());
  EXPECT_EQ(two->layout_of("rl", "rollout"), (parallel_layout{1, 2, 1}));
  EXPECT_EQ(two->find("rollout")->devices, (std::vector<int64_t>{1, 2}));
  const double layer = 32 * 16 + 2 * 32 * 16 + 16 * 32 + 3 * 32 * 32 + 2 * 32;
  const double rest = 130 * 32 * 2 + 32; // as the policy's rank 1 at tp 2
  EXPECT_DOUBLE_EQ(weights(*two, "rollout[dp 0, tp 1]"), 4 * (2 * layer + rest));
  EXPECT_LT(weights(*two, "rollout[dp 0, tp 0]"), weights(*one, "rollout"));
  // Each rank maps the whole version while it copies its part in (shm).
  const double whole = 4 * (2 * (32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64 + 2 * 32) +
                            2 * 259 * 32 + 32);
  EXPECT_DOUBLE_EQ(term(*two, "rollout[dp 0, tp 1]", "received weights (while loading)"), whole);
  EXPECT_NE(two->render().find("weights: policy → rollout by shm"), std::string::npos)
      << two->render();
  auto refusal = [](expected<placement_plan> p) {
    EXPECT_FALSE(p);
    return p ? std::string{} : describe(p.error());
  };
  auto forced = refusal(plan_of(pools + "  roles: [{role: rollout, pool: b, tp: 2}]\n",
                                {"weight_sync.transport=broadcast"}));
  EXPECT_NE(forced.find("weight_sync.transport broadcast: the rollout (2 ranks) has several ranks "
                        "that each receive the weights, and broadcast reaches one receiver"),
            std::string::npos)
      << forced;
  auto far = refusal(plan_of("placement:\n  mode: hybrid\n  pools: [{name: a, devices: 2}, "
                             "{name: b, devices: 2}]\n  roles: [{role: rollout, pool: b, tp: 2}]\n",
                             {"resources.nodes=2", "resources.devices_per_node=2"}));
  EXPECT_NE(far.find("weight_sync.dir: the rollout (2 ranks) is on another node than the policy"),
            std::string::npos)
      << far;
}

// NOTE [pipeline memory]: a stage holds its layers (the first also the
// embedding, the last the norm and the head), its ranks are named by their
// stage, and troupe plan prints the stages and the 1F1B grid.
TEST(Placement, PipelineStagesHoldTheirLayersAndThePlanPrintsTheGrid) {
  std::string p = troupe::actors::rl::testing::disaggregated_placement;
  p.replace(p.find("{role: policy, pool: train, dp: 2}"), 34,
            "{role: policy, pool: train, pp: 2, pp_micro_batches: 4}");
  auto pp = plan_of(p, {});
  ASSERT_TRUE(pp) << describe(pp.error());
  EXPECT_EQ(pp->layout_of("rl", "policy"), (parallel_layout{1, 1, 2}));
  // tiny_job: H 32, I 64, 2 layers, 2 heads of 16, 1 kv head, vocab 259.
  const double layer = 32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64 + 2 * 32;
  EXPECT_DOUBLE_EQ(weights(*pp, "policy[dp 0, pp 0]"), 4 * (layer + 259 * 32));
  EXPECT_DOUBLE_EQ(weights(*pp, "policy[dp 0, pp 1]"), 4 * (layer + 259 * 32 + 32));
  // Each stage's share of the pipeline's mailboxes (NOTE [shm
  // point-to-point]: one a direction, pp + 1 slots of a header line and
  // 1 MiB).
  EXPECT_DOUBLE_EQ(term(*pp, "policy[dp 0, pp 0]", "PP shared-memory hand-offs (its share)"),
                   2.0 * 3 * (64 + 1024 * 1024) / 2);
  // A tied embedding (NOTE [tied embedding under PP]): the last stage holds
  // a copy of it as its head, and zero2 / zero3 are refused.
  const auto dir =
      std::filesystem::temp_directory_path() / ("troupe-tied-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream f(dir / "config.json");
    f << R"({"model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 259,
             "max_position_embeddings": 128, "tie_word_embeddings": true})";
  }
  const std::string path = "model.path=" + dir.string();
  auto tied = plan_of(p, {path});
  ASSERT_TRUE(tied) << describe(tied.error());
  EXPECT_DOUBLE_EQ(weights(*tied, "policy[dp 0, pp 1]"), 4 * (layer + 259 * 32 + 32));
  EXPECT_DOUBLE_EQ(weights(*tied, "policy[dp 0, pp 0]"), 4 * (layer + 259 * 32));
  std::string zero2 = p;
  zero2.replace(zero2.find("pp_micro_batches: 4}"), 20, "pp_micro_batches: 4, strategy: zero2}");
  auto refused = plan_of(zero2, {path});
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(refused);
  EXPECT_NE(describe(refused.error())
                .find(".strategy: a tied embedding under pipeline parallelism takes ddp or zero1 "
                      "(zero2 reduces the gradients during backward"),
            std::string::npos)
      << describe(refused.error());
  const auto text = pp->render();
  EXPECT_NE(text.find("policy: pool train, dp 1, pp 2, devices [0, 1]"), std::string::npos) << text;
  EXPECT_NE(text.find("stages: layers 1 + 1; 4 micro-batches, 1F1B:"), std::string::npos) << text;
  EXPECT_NE(text.find("stage 0 | F0 F1 .  B0 F2 B1 F3 B2 .  B3"), std::string::npos) << text;
  EXPECT_NE(text.find("bubble 20.0% of 10 slots"), std::string::npos) << text;
  EXPECT_NE(text.find("a rank receives a step: pp "), std::string::npos) << text;
}

// NOTE [layout suggestions]: the policy's 2 ranks as dp 2, tp 2 or pp 2,
// each moving bytes along its own dimension only (NOTE [communication
// volume]), cheapest first; 4 ranks add layouts the model refuses (tp 4
// over 2 heads, pp 4 over 2 layers), listed last with the check's words.
TEST(Placement, LayoutSuggestionsSpanTpAndPpCheapestCommunicationFirst) {
  std::string p = troupe::actors::rl::testing::disaggregated_placement;
  auto c = parse_job(tiny_job("run") + p);
  ASSERT_TRUE(c) << describe(c.error());
  std::vector<layout_fit> policy;
  for (const auto& f : suggest_layouts(*c))
    if (f.role == "policy")
      policy.push_back(f);
  ASSERT_EQ(policy.size(), 3u);
  for (size_t i = 0; i < policy.size(); ++i) {
    const auto& f = policy[i];
    EXPECT_TRUE(f.fits) << f.refusal;
    EXPECT_EQ(f.layout.ranks(), 2);
    EXPECT_EQ(f.yaml_path, "placement.roles[0]");
    EXPECT_EQ(f.comm.dp > 0, f.layout.dp == 2);
    EXPECT_EQ(f.comm.tp > 0, f.layout.tp == 2);
    EXPECT_EQ(f.comm.pp > 0, f.layout.pp == 2);
    if (i > 0) {
      EXPECT_LE(policy[i - 1].comm.total(), f.comm.total());
    }
  }
  EXPECT_NE(render_layouts(policy).find("dp 1, tp 1, pp 2: fits, its devices peak at "),
            std::string::npos)
      << render_layouts(policy);
  p.replace(p.find("{name: train, devices: 2}"), 25, "{name: train, devices: 4}");
  p.replace(p.find("{role: policy, pool: train, dp: 2}"), 34, "{role: policy, pool: train, dp: 4}");
  auto four = parse_job(tiny_job("run") + p, {"rl.prompts_per_iteration=8"});
  ASSERT_TRUE(four) << describe(four.error());
  std::vector<layout_fit> all;
  for (const auto& f : suggest_layouts(*four))
    if (f.role == "policy")
      all.push_back(f);
  ASSERT_EQ(all.size(), 6u); // (tp, pp): (1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (4, 1)
  auto refusal_of = [&](int tp, int pp) {
    for (const auto& f : all)
      if (f.layout.tp == tp && f.layout.pp == pp)
        return f.fits ? std::string{"fits"} : f.refusal;
    return std::string{"absent"};
  };
  EXPECT_NE(refusal_of(4, 1).find("tp 4 does not divide the attention heads (2)"),
            std::string::npos)
      << refusal_of(4, 1);
  EXPECT_NE(refusal_of(1, 4).find("pp 4 over 2 layers: more stages than layers"),
            std::string::npos)
      << refusal_of(1, 4);
  EXPECT_FALSE(all.back().fits);
}

// NOTE [peer state]: a trainer that may restart from a DP peer keeps a
// copy of its weights and AdamW moments from the start of each update
// (4 + 8 bytes a parameter in fp32); the plan counts it on each rank. A
// trainer that would roll back instead (zero1) keeps none.
TEST(Placement, ARestartableDdpTrainerCountsTheStateItKeeps) {
  const std::string kept = "state kept before each update (supervision)";
  const std::string restartable = "supervision.roles=[{role: policy, max_restarts: 1}]";
  auto plain = plan_of(troupe::actors::rl::testing::disaggregated_placement, {});
  auto ddp = plan_of(troupe::actors::rl::testing::disaggregated_placement, {restartable});
  std::string sharded = troupe::actors::rl::testing::disaggregated_placement;
  sharded.replace(sharded.find("{role: policy, pool: train, dp: 2}"), 34,
                  "{role: policy, pool: train, dp: 2, strategy: zero1}");
  auto zero1 = plan_of(sharded, {restartable});
  ASSERT_TRUE(plain) << describe(plain.error());
  ASSERT_TRUE(ddp) << describe(ddp.error());
  ASSERT_TRUE(zero1) << describe(zero1.error());
  ASSERT_EQ(ddp->devices[0].peak_stage, "rl");
  const double P = static_cast<double>(ddp->parameters);
  EXPECT_DOUBLE_EQ(term(*ddp, "policy[dp 0]", kept), 12 * P);
  EXPECT_DOUBLE_EQ(term(*ddp, "policy[dp 1]", kept), 12 * P);
  EXPECT_EQ(term(*ddp, "critic[dp 0]", kept), -1.0) << "the critic may not restart";
  EXPECT_EQ(term(*plain, "policy[dp 0]", kept), -1.0);
  EXPECT_EQ(term(*zero1, "policy[dp 0]", kept), -1.0);
  EXPECT_DOUBLE_EQ(ddp->devices[0].peak_bytes - plain->devices[0].peak_bytes, 12 * P);
}

// NOTE [rank memory]: over 2 ranks a policy rank's states are 4 + 4 + 8
// bytes a parameter under ddp, 4 + (4 + 4/2) + 8/2 under zero1, 4 + 4/2 +
// 8/2 under zero2 and 16/2 under zero3, which keeps only each layer's input
// of the activations; the other roles unchanged. troupe plan prints the
// terms a rank.
TEST(Placement, ZeroStrategiesLowerATrainingRanksEstimate) {
  auto with = [](const std::string& strategy) {
    std::string p = troupe::actors::rl::testing::disaggregated_placement;
    auto at = p.find("{role: policy, pool: train, dp: 2}");
    EXPECT_NE(at, std::string::npos);
    p.replace(at, 34, "{role: policy, pool: train, dp: 2, strategy: " + strategy + "}");
    return plan_of(p, {});
  };
  auto term = [](const placement_plan& plan, std::string_view name) {
    for (const auto& r : plan.devices[0].peak_ranks)
      if (r.rank == "policy[dp 0]")
        for (const auto& t : r.terms)
          if (t.name == name)
            return t.bytes;
    return -1.0;
  };
  auto ddp = with("ddp"), zero1 = with("zero1"), zero2 = with("zero2"), zero3 = with("zero3");
  ASSERT_TRUE(ddp) << describe(ddp.error());
  ASSERT_TRUE(zero1) << describe(zero1.error());
  ASSERT_TRUE(zero2) << describe(zero2.error());
  ASSERT_TRUE(zero3) << describe(zero3.error());
  EXPECT_EQ(zero1->devices[0].peak_stage, ddp->devices[0].peak_stage);
  const double P = static_cast<double>(ddp->parameters);
  struct want {
    const placement_plan* plan;
    double weights, gradients, optimizer;
  };
  for (const auto& w : {want{&*ddp, 4, 4, 8}, want{&*zero1, 4, 6, 4}, want{&*zero2, 4, 2, 4},
                        want{&*zero3, 2, 2, 4}}) {
    EXPECT_DOUBLE_EQ(term(*w.plan, "weights"), w.weights * P);
    EXPECT_DOUBLE_EQ(term(*w.plan, "gradients"), w.gradients * P);
    EXPECT_DOUBLE_EQ(term(*w.plan, "optimizer state"), w.optimizer * P);
  }
  // This tiny model's ddp rank peaks in the optimizer step (the gradient
  // norm's double copy outweighs one micro-batch's activations).
  EXPECT_DOUBLE_EQ(term(*ddp, "buffers at the optimizer step"), 8 * P);
  EXPECT_LT(zero3->devices[0].peak_bytes, ddp->devices[0].peak_bytes);
  for (const auto* p : {&zero1, &zero2, &zero3})
    EXPECT_DOUBLE_EQ((*p)->devices[2].peak_bytes, ddp->devices[2].peak_bytes) << "the rollout";
  const auto text = zero3->render();
  EXPECT_NE(text.find("policy[dp 0]: "), std::string::npos) << text;
  EXPECT_NE(text.find("optimizer state "), std::string::npos) << text;
  EXPECT_NE(text.find("buffers at "), std::string::npos) << text;
}

// NOTE [mixed precision]: at bf16 a policy rank holds 2-byte weights and
// gradients and 12 bytes of AdamW state (the masters) a parameter, under
// ddp and sharded alike; a frozen reference 2-byte weights. bf16 is refused
// where no train engine runs the role, with the key's YAML location.
TEST(Placement, Bf16RanksHoldTwoByteWeightsAndFp32Masters) {
  auto with = [](const std::string& policy, const std::string& reference) {
    std::string p = troupe::actors::rl::testing::disaggregated_placement;
    p.replace(p.find("{role: policy, pool: train, dp: 2}"), 34,
              "{role: policy, pool: train, dp: 2" + policy + "}");
    p.replace(p.find("{role: reference, pool: judge}"), 30,
              "{role: reference, pool: judge" + reference + "}");
    return plan_of(p, {"stages=[sft, rl]"}); // the judges' device peaks in rl
  };
  auto term = [](const placement_plan& plan, const std::string& rank, std::string_view name) {
    for (const auto& d : plan.devices)
      for (const auto& r : d.peak_ranks)
        if (r.rank == rank)
          for (const auto& t : r.terms)
            if (t.name == name)
              return t.bytes;
    return -1.0;
  };
  auto fp32 = with("", ""), ddp = with(", precision: bf16", ", precision: bf16"),
       zero3 = with(", strategy: zero3, precision: bf16", "");
  ASSERT_TRUE(fp32) << describe(fp32.error());
  ASSERT_TRUE(ddp) << describe(ddp.error());
  ASSERT_TRUE(zero3) << describe(zero3.error());
  const auto text = zero3->render();
  EXPECT_NE(text.find("policy: pool train, dp 2, zero3, bf16, devices [0, 1]"), std::string::npos)
      << text;
  const double P = static_cast<double>(fp32->parameters);
  EXPECT_DOUBLE_EQ(term(*ddp, "policy[dp 0]", "weights"), 2 * P);
  EXPECT_DOUBLE_EQ(term(*ddp, "policy[dp 0]", "gradients"), 2 * P);
  EXPECT_DOUBLE_EQ(term(*ddp, "policy[dp 0]", "optimizer state"), 12 * P);
  EXPECT_DOUBLE_EQ(term(*zero3, "policy[dp 0]", "weights"), 1 * P);
  EXPECT_DOUBLE_EQ(term(*zero3, "policy[dp 0]", "optimizer state"), 6 * P);
  EXPECT_DOUBLE_EQ(term(*ddp, "reference", "weights"), term(*fp32, "reference", "weights") / 2);
  // The states weigh 16 bytes a parameter either way (the ZeRO paper's
  // 2 + 2 + 12): under ddp mixed precision saves activations, not states.
  auto states = [&](const placement_plan& plan) {
    return term(plan, "policy[dp 0]", "weights") + term(plan, "policy[dp 0]", "gradients") +
           term(plan, "policy[dp 0]", "optimizer state");
  };
  EXPECT_DOUBLE_EQ(states(*ddp), 16 * P);
  EXPECT_DOUBLE_EQ(states(*fp32), 16 * P);
  const std::string pools = "placement:\n  mode: hybrid\n  pools: [{name: a, devices: 1}]\n";
  auto e = error_of(pools + "  roles: [{role: rollout, pool: a, precision: bf16}]\n");
  EXPECT_NE(e.find("job.yaml:18:47: placement.roles[0].precision: the rollout engine decodes in "
                   "fp32; bf16 is for the roles a train engine runs (policy, critic, reference, "
                   "reward)"),
            std::string::npos)
      << e;
  e = error_of(pools + "  roles: [{role: reward, pool: a, precision: bf16}]\n",
               {"stages=[sft, rl]"});
  EXPECT_NE(e.find("placement.roles[0].precision: the reward is a rule (rl.reward.kind: rule)"),
            std::string::npos)
      << e;
  e = error_of(pools + "  roles: [{role: policy, pool: a, precision: fp16}]\n");
  EXPECT_NE(e.find("placement.roles[0].precision: expected one of fp32, bf16, got 'fp16'"),
            std::string::npos)
      << e;
}

// NOTE [strategy suggestions]: with room for all, ddp comes first and zero3
// (1.5x the bytes) last; on devices between zero3's need and ddp's only
// zero3 fits, and it is listed first.
TEST(Placement, SuggestionsListTheStrategiesThatFitCheapestFirst) {
  const std::string placement = troupe::actors::rl::testing::disaggregated_placement;
  // Long rl minibatches: the trainers' devices hold the largest peak.
  auto c =
      parse_job(tiny_job("run") + placement, {"rl.prompts_per_iteration=64", "rl.minibatches=1"});
  ASSERT_TRUE(c) << describe(c.error());
  auto policy = [](const std::vector<strategy_fit>& all) {
    std::vector<strategy_fit> out;
    for (const auto& f : all)
      if (f.role == "policy")
        out.push_back(f);
    return out;
  };
  auto roomy = policy(suggest_strategies(*c));
  ASSERT_EQ(roomy.size(), 4u);
  for (const auto& f : roomy)
    EXPECT_TRUE(f.fits) << to_string(f.strategy) << ": " << f.refusal;
  EXPECT_EQ(roomy.back().strategy, troupe::actors::train::dp_strategy::zero3);
  EXPECT_NEAR(roomy.back().received_bytes, 1.5 * roomy.front().received_bytes, 1.0);
  EXPECT_EQ(roomy.back().yaml_path, "placement.roles[0].strategy");
  auto plan_with = [&](troupe::actors::train::dp_strategy s) {
    auto changed = *c;
    changed.placement.roles[0].strategy = s;
    return make_plan(changed);
  };
  auto ddp = plan_with(troupe::actors::train::dp_strategy::ddp),
       zero3 = plan_with(troupe::actors::train::dp_strategy::zero3);
  ASSERT_TRUE(ddp && zero3);
  auto tight = *c;
  tight.resources.device_memory_gb =
      (ddp->devices[0].peak_bytes + zero3->devices[0].peak_bytes) / 2 / (1024.0 * 1024 * 1024);
  for (size_t d = 2; d < ddp->devices.size(); ++d)
    ASSERT_GT(tight.resources.device_memory_gb * 1024 * 1024 * 1024, ddp->devices[d].peak_bytes)
        << "the other pools must fit";
  auto fits = policy(suggest_strategies(tight));
  ASSERT_EQ(fits.size(), 4u);
  EXPECT_EQ(fits.front().strategy, troupe::actors::train::dp_strategy::zero3);
  EXPECT_TRUE(fits.front().fits);
  for (size_t i = 1; i < fits.size(); ++i) {
    EXPECT_FALSE(fits[i].fits) << to_string(fits[i].strategy);
    EXPECT_NE(fits[i].refusal.find("the largest term is policy[dp 0]'s"), std::string::npos)
        << fits[i].refusal;
  }
  EXPECT_NE(render_suggestions(fits).find("zero3: fits, a rank "), std::string::npos);
}
