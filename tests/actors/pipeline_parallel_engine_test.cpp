// Training under pipeline parallelism (NOTE [pipeline execution] in
// actors/train/train_engine.cpp): PP 2, PP 4, DP 2 × PP 2 (zero1, zero2 and zero3 over DP),
// TP 2 × PP 2 and DP 2 × TP 2 × PP 2 train the same model on the same
// global batches to within 1e-5 of one engine after 5 Adam steps (gloo
// ranks in this process, one thread a rank), for SFT, PPO updates and a
// critic; forward-only requests flow through the stages and every stage
// answers the last one's result; each stage runs the 1F1B list of its
// schedule; the first stage exports the whole model.
#include "actors/actor_system.hpp"
#include "actors/train/engine_group.hpp"
#include "actors/train/train_engine.hpp"
#include "models/pipeline_parallel.hpp"
#include "runtime/pipeline_schedule.hpp"
#include "tests/actors/mesh_group.hpp"
#include "tests/actors/mesh_training.hpp"
#include "tests/actors/tiny_engine.hpp"
#include "tests/support/ranks.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace troupe;
using namespace troupe::actors;
using troupe::actors::inference::testing::tiny_config;
using troupe::actors::inference::testing::tiny_model;
using troupe::testing::on_every_rank;
using namespace troupe::testing::mesh;

namespace {

// The tiny model with `layers` layers (seeded), its embedding `tied` to
// the LM head or not.
models::llama_model deep_model(int64_t layers, uint64_t seed, bool tied = false) {
  auto c = tiny_config();
  c.num_hidden_layers = layers;
  c.tie_word_embeddings = tied;
  torch::manual_seed(seed);
  auto m = models::make_llama(c, models::head_kind::lm);
  EXPECT_TRUE(m);
  return *m;
}

TEST(PipelineParallelEngine, TwoStagesTrainSftLikeOneEngine) {
  expect_like_one(tiny_model(21), models::head_kind::lm, sft(), layout{1, 1, 2});
}

TEST(PipelineParallelEngine, TwoStagesRunPpoUpdatesWithFourMicroBatchesLikeOneEngine) {
  expect_like_one(tiny_model(22), models::head_kind::lm, ppo(), layout{1, 1, 2, 4});
}

TEST(PipelineParallelEngine, TwoStagesTrainACriticLikeOneEngine) {
  expect_like_one(tiny_model(23), models::head_kind::value, critic(), layout{1, 1, 2, 3});
}

TEST(PipelineParallelEngine, FourStagesOfUnevenLayersTrainLikeOneEngine) {
  expect_like_one(deep_model(6, 24), models::head_kind::lm, ppo(), layout{1, 1, 4, 8});
}

TEST(PipelineParallelEngine, Zero1OverDpTwoWithTwoStagesTrainsLikeOneEngine) {
  expect_like_one(tiny_model(25), models::head_kind::lm, sft(), layout{2, 1, 2},
                  train::dp_strategy::zero1);
}

TEST(PipelineParallelEngine, Zero2OverDpTwoWithTwoStagesRunsPpoLikeOneEngine) {
  expect_like_one(tiny_model(26), models::head_kind::lm, ppo(), layout{2, 1, 2, 2},
                  train::dp_strategy::zero2);
}

TEST(PipelineParallelEngine, TpTwoByPpTwoTrainsLikeOneEngine) {
  expect_like_one(tiny_model(27), models::head_kind::lm, ppo(), layout{1, 2, 2});
}

TEST(PipelineParallelEngine, DpTwoByTpTwoByPpTwoTrainsLikeOneEngine) {
  expect_like_one(tiny_model(28), models::head_kind::lm, sft(), layout{2, 2, 2});
}

// Each stage ran exactly its list of the 1F1B schedule, and forward-only
// requests (log-probs with entropy) answer one engine's values on every
// stage.
TEST(PipelineParallelEngine, StagesRunTheirScheduleAndEveryStageAnswersTheLastOnesResult) {
  auto base = deep_model(4, 29);
  const layout l{1, 1, 4, 6};
  runtime::group_options go;
  go.name = "pp-schedule";
  auto world = runtime::make_local_groups(l.size(), go);
  ASSERT_TRUE(world);
  auto ranks = mesh_engines(*world, base, l);
  auto batch = rl_batch(12, 40);
  auto one = train::train_engine::make(copy_of(base, models::head_kind::lm), optim());
  ASSERT_TRUE(one);
  auto want = (*one)->log_probs(batch, 0.9, true);
  ASSERT_TRUE(want) << describe(want.error());
  struct result {
    std::vector<runtime::pipe_action> trained, forward;
    expected<runtime::tensor_batch> log_probs = runtime::tensor_batch{};
  };
  auto results = on_every_rank<result>(world->groups, [&](runtime::process_group& g) {
    auto& e = *ranks[static_cast<size_t>(g.rank())].engine;
    result r;
    EXPECT_TRUE(e.sft_step(batch));
    r.trained = e.last_pipeline_pass().actions;
    r.log_probs = e.log_probs(batch, 0.9, true);
    r.forward = e.last_pipeline_pass().actions;
    return r;
  });
  auto grid = runtime::one_f_one_b(4, 6);
  auto forwards = runtime::forward_only(4, 6);
  ASSERT_TRUE(grid && forwards);
  // The log-probs after one step: one engine steps too.
  ASSERT_TRUE((*one)->sft_step(batch));
  want = (*one)->log_probs(batch, 0.9, true);
  for (int s = 0; s < 4; ++s) {
    const auto& r = results[static_cast<size_t>(s)];
    EXPECT_EQ(r.trained, (*grid)[static_cast<size_t>(s)]) << "stage " << s;
    EXPECT_EQ(r.forward, (*forwards)[static_cast<size_t>(s)]) << "stage " << s;
    EXPECT_LE(runtime::peak_in_flight(r.trained), 4 - s);
    ASSERT_TRUE(r.log_probs) << describe(r.log_probs.error());
    for (const char* key : {"log_probs", "entropy"}) {
      auto a = *want->get(key), b = *r.log_probs->get(key);
      ASSERT_EQ(a.sizes(), b.sizes()) << key;
      EXPECT_LT((a - b).abs().max().item<double>(), tolerance) << key << " on stage " << s;
    }
  }
}

// The engine group serves a DP 2 × PP 2 mesh as one engine, and its
// checkpoint (each stage's shards) loads bit for bit at DP 1 × PP 2.
TEST(PipelineParallelEngine, TheGroupServesAndCheckpointsStagesAsOneEngine) {
  expect_group_like_one_engine(tiny_model(31), layout{2, 1, 2}, layout{1, 1, 2}, 32);
}

TEST(PipelineParallelEngine, StagesSplitTheLayersEvenlyOrAsListed) {
  auto even = models::split_layers(7, 3);
  ASSERT_TRUE(even);
  EXPECT_EQ(*even, (std::vector<int64_t>{3, 2, 2}));
  auto listed = models::split_layers(7, 3, {1, 2, 4});
  ASSERT_TRUE(listed);
  EXPECT_EQ(*listed, (std::vector<int64_t>{1, 2, 4}));
  auto too_many = models::split_layers(2, 3);
  ASSERT_FALSE(too_many);
  EXPECT_NE(describe(too_many.error()).find("more stages than layers"), std::string::npos);
  auto wrong_sum = models::split_layers(7, 3, {1, 2, 3});
  ASSERT_FALSE(wrong_sum);
  EXPECT_NE(describe(wrong_sum.error()).find("pp_layers sum to 6"), std::string::npos);
  auto empty_stage = models::split_layers(7, 3, {0, 3, 4});
  ASSERT_FALSE(empty_stage);
  EXPECT_NE(describe(empty_stage.error()).find("pp_layers[0] is 0"), std::string::npos);
  // A tied embedding lives on the first and the last stage.
  auto c = tiny_config();
  c.tie_word_embeddings = true;
  auto last = models::stage_of(c, 2, 3, {1, 0, 1});
  EXPECT_FALSE(last); // an empty stage: refused as above
  for (int rank : {0, 1}) {
    auto tied = models::stage_of(c, rank, 2);
    ASSERT_TRUE(tied) << describe(tied.error());
    EXPECT_TRUE(models::on_stage("tok_embeddings.weight", *tied, c)) << "stage " << rank;
  }
  // A stage holds its layers under their own numbers, the embedding on the
  // first stage and the norm and head on the last.
  auto s1 = models::stage_of(tiny_config(), 1, 2);
  ASSERT_TRUE(s1);
  EXPECT_EQ(s1->layer0, 1);
  EXPECT_EQ(s1->layers, 1);
  EXPECT_TRUE(models::on_stage("layers.1.attention.wq.weight", *s1, tiny_config()));
  EXPECT_FALSE(models::on_stage("layers.0.attention.wq.weight", *s1, tiny_config()));
  EXPECT_FALSE(models::on_stage("tok_embeddings.weight", *s1, tiny_config()));
  EXPECT_TRUE(models::on_stage("output.weight", *s1, tiny_config()));
}

// NOTE [tied embedding under PP]: the tied model (no output matrix: the
// head is the embedding) trains on two stages, on four stages (the first
// and last not neighbours) with zero1 over DP 2, and under TP 2 × PP 2, as
// one engine does.
models::llama_model tied_model(int64_t layers, uint64_t seed) {
  return deep_model(layers, seed, true);
}

TEST(PipelineParallelEngine, ATiedEmbeddingOnTwoStagesRunsPpoLikeOneEngine) {
  expect_like_one(tied_model(2, 36), models::head_kind::lm, ppo(), layout{1, 1, 2, 4});
}

TEST(PipelineParallelEngine, ATiedEmbeddingOnFourStagesWithZero1OverDpTwoTrainsLikeOneEngine) {
  expect_like_one(tied_model(4, 37), models::head_kind::lm, sft(), layout{2, 1, 4, 4},
                  train::dp_strategy::zero1);
}

TEST(PipelineParallelEngine, ATiedEmbeddingUnderTpTwoByPpTwoTrainsLikeOneEngine) {
  expect_like_one(tied_model(2, 38), models::head_kind::lm, sft(), layout{1, 2, 2});
}

// Both copies are equal bit for bit after the steps (the stages add the
// same two gradients in the same order and step them with the same state),
// also when the last stage's copy started out different: joining makes it
// the first stage's.
TEST(PipelineParallelEngine, TheTiedEmbeddingsTwoCopiesStayEqual) {
  auto base = tied_model(2, 39);
  const layout l{1, 1, 2, 2};
  runtime::group_options go;
  go.name = "pp-tied-copies";
  auto world = runtime::make_local_groups(l.size(), go);
  ASSERT_TRUE(world);
  const auto dense = copy_of(base, models::head_kind::lm);
  auto copies = on_every_rank<at::Tensor>(world->groups, [&](runtime::process_group& g) {
    auto lines = runtime::make_mesh_groups(g, runtime::rank_mesh{{1, 2}}, {"dp", "pp"});
    auto pp = std::make_shared<runtime::process_group>(std::move((*lines)[1]));
    auto stage = models::stage_of(base->config(), *pp);
    auto model = models::make_model_part(dense, {}, *stage);
    EXPECT_TRUE(model) << describe(model.error());
    if (pp->rank() == 1) { // a copy that differs before joining
      torch::NoGradGuard no_grad;
      (*model)->named_parameters()["tok_embeddings.weight"].add_(0.5);
    }
    auto e = train::train_engine::make(*model, optim());
    auto d = std::make_shared<train::data_parallel_group>();
    d->group = std::move((*lines)[0]);
    d->pp = pp;
    EXPECT_TRUE((*e)->join_data_parallel(d, {train::dp_strategy::ddp, 25}));
    EXPECT_TRUE((*e)->set_pipeline_micro_batches(2));
    for (size_t s = 0; s < 3; ++s)
      EXPECT_TRUE((*e)->sft_step(step_batches()[s]));
    return (*model)->named_parameters()["tok_embeddings.weight"].detach().clone();
  });
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_TRUE(torch::equal(copies[0], copies[1]));
  // And they moved: the step changed the embedding.
  EXPECT_FALSE(torch::equal(copies[0], dense->named_parameters()["tok_embeddings.weight"]));
}

// zero2 and zero3 reduce over DP during backward, before the two stages
// could add their copies' gradients: refused with the reason.
TEST(PipelineParallelEngine, ATiedEmbeddingUnderPpRefusesZero2WithAReason) {
  auto base = tied_model(2, 40);
  runtime::group_options go;
  go.name = "pp-tied-zero2";
  auto world = runtime::make_local_groups(4, go);
  ASSERT_TRUE(world);
  auto errors = on_every_rank<std::string>(world->groups, [&](runtime::process_group& g) {
    auto lines = runtime::make_mesh_groups(g, runtime::rank_mesh{{2, 2}}, {"dp", "pp"});
    auto d = std::make_shared<train::data_parallel_group>();
    d->pp = std::make_shared<runtime::process_group>(std::move((*lines)[1]));
    auto stage = models::stage_of(base->config(), *d->pp);
    auto model = models::make_model_part(base, {}, *stage);
    auto e = train::train_engine::make(*model, optim());
    d->group = std::move((*lines)[0]);
    auto ok = (*e)->join_data_parallel(d, {train::dp_strategy::zero2, 25});
    return ok ? std::string{} : describe(ok.error());
  });
  for (const auto& e : errors)
    EXPECT_NE(e.find("a tied embedding under pipeline parallelism takes ddp or zero1"),
              std::string::npos)
        << e;
}

// zero3 over the DP line of each stage: a stage's layers and its rest
// (the embedding on the first, norm and head on the last) sharded over DP;
// under 1F1B each layer is gathered again in its backward.
TEST(PipelineParallelEngine, Zero3OverDpTwoWithTwoStagesRunsPpoLikeOneEngine) {
  expect_like_one(tiny_model(30), models::head_kind::lm, ppo(), layout{2, 1, 2, 2},
                  train::dp_strategy::zero3);
}

TEST(PipelineParallelEngine, Zero3OverDpTwoByTpTwoByPpTwoTrainsLikeOneEngine) {
  expect_like_one(tiny_model(33), models::head_kind::lm, sft(), layout{2, 2, 2},
                  train::dp_strategy::zero3);
}

// A forward-only pass under zero3 gathers a layer at a time on every DP
// rank at once, so ranks with fewer micro-batches (3 rows against 4, cut
// into up to 4) run their last again: each rank's log-probs are still one
// engine's for its rows.
TEST(PipelineParallelEngine, Zero3StagesAnswerLogProbsForUnevenDpShares) {
  auto base = tiny_model(34);
  const layout l{2, 1, 2, 4};
  runtime::group_options go;
  go.name = "pp-zero3-forward";
  auto world = runtime::make_local_groups(l.size(), go);
  ASSERT_TRUE(world);
  auto ranks = mesh_engines(*world, base, l, models::head_kind::lm, train::dp_strategy::zero3);
  auto batch = rl_batch(7, 41);
  auto one = train::train_engine::make(copy_of(base, models::head_kind::lm), optim());
  ASSERT_TRUE(one);
  auto results = on_every_rank<expected<runtime::tensor_batch>>(
      world->groups, [&](runtime::process_group& g) -> expected<runtime::tensor_batch> {
        auto share = l.dp_rank(g.rank()) == 0 ? batch.slice(0, 4) : batch.slice(4, 7);
        if (!share)
          return share.error();
        return ranks[static_cast<size_t>(g.rank())].engine->log_probs(*share, 1.0, true);
      });
  for (int r = 0; r < l.size(); ++r) {
    auto share = l.dp_rank(r) == 0 ? batch.slice(0, 4) : batch.slice(4, 7);
    ASSERT_TRUE(share);
    auto want = (*one)->log_probs(*share, 1.0, true);
    ASSERT_TRUE(want) << describe(want.error());
    const auto& got = results[static_cast<size_t>(r)];
    ASSERT_TRUE(got) << "rank " << r << ": " << describe(got.error());
    for (const char* key : {"log_probs", "entropy"}) {
      auto a = *want->get(key), b = *got->get(key);
      ASSERT_EQ(a.sizes(), b.sizes()) << key;
      EXPECT_LT((a - b).abs().max().item<double>(), tolerance) << key << " on rank " << r;
    }
  }
}

} // namespace

namespace {

// NOTE [pipeline export] into rollouts of another layout: a TP 2 × PP 2
// policy's export (its first stage gathers its TP group's parts and
// receives the later stage's) loads into a TP 1 rollout engine's model and
// into each rank's part of a TP 2 one (assign_hf_weights cuts it: NOTE
// [tensor-parallel decode]) bit for bit, and the TP 2 rollout then
// generates what the TP 1 one does.
TEST(PipelineParallelEngine, ATpTwoByPpTwoPolicysWeightsReachRolloutsOfTpOneAndTwo) {
  auto base = tiny_model(33);
  const layout l{1, 2, 2};
  runtime::group_options go;
  go.name = "pp-sync";
  auto world = runtime::make_local_groups(l.size(), go);
  ASSERT_TRUE(world);
  auto ranks = mesh_engines(*world, base, l);
  step_batches();
  auto exported = on_every_rank<std::map<std::string, at::Tensor>>(
      world->groups, [&](runtime::process_group& g) -> std::map<std::string, at::Tensor> {
        auto& e = *ranks[static_cast<size_t>(g.rank())].engine;
        for (size_t s = 0; s < 2; ++s)
          EXPECT_TRUE(e.sft_step(step_batches()[s]));
        if (g.rank() == 0)
          return e.export_weights();
        EXPECT_TRUE(e.gather_weights());
        return {};
      });
  const auto& whole = exported.front();
  ASSERT_EQ(whole.size(), models::export_hf_weights(base).size());
  // TP 1: the rollout's model holds the export.
  auto one = tiny_model(34);
  auto rollout = actors::inference::testing::make_engine(one);
  ASSERT_TRUE(rollout->load_weights(1, whole));
  for (const auto& [name, t] : models::export_hf_weights(one))
    EXPECT_TRUE(torch::equal(t, whole.at(name))) << name;
  std::vector<actors::inference::generate_request> reqs{
      {"a", {3, 1, 4, 1, 5}, actors::inference::testing::greedy(8)},
      {"b", {2, 7, 1, 8}, actors::inference::testing::greedy(8)}};
  auto want = rollout->generate(reqs);
  ASSERT_TRUE(want) << describe(want.error());
  // TP 2: each rank's part holds its slice of the export.
  go.name = "pp-sync-tp2";
  auto tp2 = runtime::make_local_groups(2, go);
  ASSERT_TRUE(tp2);
  const auto dense = tiny_model(35);
  auto outs = on_every_rank<std::vector<actors::inference::request_output>>(
      tp2->groups,
      [&](runtime::process_group& g) -> std::vector<actors::inference::request_output> {
        auto part = models::partition_llama(dense->config(), g);
        auto model = models::make_model_part(dense, *part);
        EXPECT_TRUE(part && model);
        auto e = actors::inference::testing::make_engine(*model);
        EXPECT_TRUE(e->load_weights(1, whole));
        for (const auto& [name, t] : (*model)->named_weights()) {
          const auto hf = *models::to_hf_name(name, models::head_kind::lm);
          const auto s = models::tp_slice_of(name, dense->config(), *part);
          const auto& w = whole.at(hf);
          EXPECT_TRUE(
              torch::equal(t, s.replicated() ? w : w.narrow(s.dim, s.begin, s.end - s.begin)))
              << name << " on rank " << g.rank();
        }
        auto o = e->generate(reqs);
        EXPECT_TRUE(o) << describe(o.error());
        return o ? *o : std::vector<actors::inference::request_output>{};
      });
  for (const auto& o : outs) {
    ASSERT_EQ(o.size(), want->size());
    for (size_t r = 0; r < o.size(); ++r)
      EXPECT_EQ(o[r].samples[0].tokens, (*want)[r].samples[0].tokens);
  }
}

} // namespace
