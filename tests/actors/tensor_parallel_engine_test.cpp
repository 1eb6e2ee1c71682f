// Training under tensor parallelism (NOTE [tensor parallelism]): TP 2, and
// DP 2 × TP 2 under ddp, zero1, zero2 and zero3 over the DP dimension, train the same
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

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace troupe;
using namespace troupe::actors;
using troupe::actors::inference::testing::copy_of;
using troupe::actors::inference::testing::rl_batch;
using troupe::actors::inference::testing::tiny_model;

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

// zero3 over the DP line of each TP rank's part: a layer's shards gathered
// over DP, its TP sums inside it (run twice: forward, then again in
// backward), the replicated parameters counted once in the norm.
TEST(TensorParallelEngine, Zero3OverDpWithTpTwoRunsPpoLikeOneEngine) {
  expect_like_one(16, models::head_kind::lm, ppo(), 2, 2, train::dp_strategy::zero3);
}

} // namespace
