// Training under tensor parallelism (NOTE [tensor parallelism]): TP 2, and
// DP 2 × TP 2 under ddp, zero1 and zero2 over the DP dimension, train the same
// model on the same global batches to within 1e-5 of one engine after 5
// Adam steps (gloo ranks in this process, one thread a rank), with the
// gradient clip active (NOTE [tensor-parallel norm]), for SFT, PPO updates
// and a critic; the export gathers the whole weights; the engine group
// gives each replica's rows to its TP ranks (NOTE [tensor-parallel
// dispatch]).
#include "actors/actor_system.hpp"
#include "actors/train/engine_group.hpp"
#include "actors/train/train_engine.hpp"
#include "models/tensor_parallel.hpp"
#include "tests/actors/mesh_group.hpp"
#include "tests/actors/mesh_training.hpp"
#include "tests/actors/tiny_engine.hpp"
#include "tests/support/ranks.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace troupe;
using namespace troupe::actors;
using troupe::actors::inference::testing::copy_of;
using troupe::actors::inference::testing::rl_batch;
using troupe::actors::inference::testing::tiny_model;
using troupe::testing::on_every_rank;

using namespace troupe::testing::mesh;

namespace {

void expect_like_one(uint64_t seed, models::head_kind head, const step_fn& step, int dp, int tp,
                     train::dp_strategy strategy = train::dp_strategy::ddp) {
  expect_like_one(tiny_model(seed), head, step, layout{dp, tp}, strategy);
}

TEST(TensorParallelEngine, TwoRanksTrainSftLikeOneEngine) {
  expect_like_one(11, models::head_kind::lm, sft(), 1, 2);
}

TEST(TensorParallelEngine, TwoRanksRunPpoUpdatesLikeOneEngine) {
  expect_like_one(12, models::head_kind::lm, ppo(), 1, 2);
}

TEST(TensorParallelEngine, TwoRanksTrainACriticLikeOneEngine) {
  expect_like_one(13, models::head_kind::value, critic(), 1, 2);
}

TEST(TensorParallelEngine, DpTwoByTpTwoTrainsLikeOneEngine) {
  expect_like_one(14, models::head_kind::lm, ppo(), 2, 2);
}

TEST(TensorParallelEngine, Zero1OverDpWithTpTwoTrainsLikeOneEngine) {
  expect_like_one(15, models::head_kind::lm, sft(), 2, 2, train::dp_strategy::zero1);
}

// zero2 reduce-scatters over the DP group during backward, while the TP
// layers all-reduce over the TP group in the same backward.
TEST(TensorParallelEngine, Zero2OverDpWithTpTwoRunsPpoLikeOneEngine) {
  expect_like_one(19, models::head_kind::lm, ppo(), 2, 2, train::dp_strategy::zero2);
}

TEST(TensorParallelEngine, TheGroupGivesEachReplicasRowsToItsTpRanks) {
  // A checkpoint of dp 2 × tp 2 lands in a model at dp 1 × tp 2.
  expect_group_like_one_engine(tiny_model(17), layout{2, 2}, layout{1, 2}, 18);
}

TEST(TensorParallelEngine, Zero3UnderTpIsRefusedWithAReason) {
  auto base = tiny_model(16);
  runtime::group_options go;
  go.name = "tp-zero3";
  auto world = runtime::make_local_groups(4, go);
  ASSERT_TRUE(world);
  auto errors = on_every_rank<std::string>(world->groups, [&](runtime::process_group& g) {
    auto lines = runtime::make_mesh_groups(g, runtime::rank_mesh{{2, 2}}, {"dp", "tp"});
    auto part = models::partition_llama(base->config(), (*lines)[1]);
    auto model = models::make_llama(base->config(), models::head_kind::lm, *part);
    auto e = train::train_engine::make(*model, optim());
    auto d = std::make_shared<train::data_parallel_group>();
    d->group = std::move((*lines)[0]);
    auto ok = (*e)->join_data_parallel(d, {train::dp_strategy::zero3, 25});
    return ok ? std::string{} : describe(ok.error());
  });
  for (const auto& e : errors)
    EXPECT_NE(e.find("zero3 under tensor parallelism"), std::string::npos) << e;
}

} // namespace
