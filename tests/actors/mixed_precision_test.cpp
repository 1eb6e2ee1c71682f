// NOTE [mixed precision]: a train engine at precision bf16 — bf16 weights,
// activations and gradients, fp32 masters and AdamW state — against the
// same engine in fp32, and the masters' part in steps, states and loads.
// (Under DP strategies: EngineGroupBf16 in engine_group_test.cpp.)
#include "actors/train/train_engine.hpp"
#include "tests/actors/tiny_engine.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sstream>

using namespace troupe;
using namespace troupe::actors;
using troupe::actors::inference::testing::copy_of;
using troupe::actors::inference::testing::fixed_batch;
using troupe::actors::inference::testing::state_tensors;
using troupe::actors::inference::testing::tiny_model;

namespace {

std::unique_ptr<train::train_engine> trainer(models::llama_model m, train::precision p,
                                             double lr = 3e-3) {
  train::optimizer_options o;
  o.lr = lr;
  o.grad_clip = 1.0;
  auto e = train::train_engine::make(std::move(m), o);
  EXPECT_TRUE(e) << describe(e.error());
  EXPECT_TRUE((*e)->set_precision(p));
  return std::move(*e);
}

// The weights, end to end in parameter order, in fp32.
at::Tensor flat_weights(const train::train_engine& e) {
  std::vector<at::Tensor> parts;
  for (const auto& p : e.model()->parameters())
    parts.push_back(p.detach().reshape({-1}).to(at::kFloat));
  return at::cat(parts);
}

} // namespace

// The stated tolerance (docs/parallelism.md): over ten SFT steps the bf16
// engine's loss stays within 1 % of the fp32 engine's, and what training
// changed in the weights agrees with fp32's change within 10 % (L2, each from
// its start; bf16 keeps 8 bits of mantissa).
TEST(MixedPrecision, Bf16TrainsAsFp32WithinTheStatedTolerance) {
  auto base = tiny_model(21);
  auto wide = trainer(copy_of(base, models::head_kind::lm), train::precision::fp32);
  auto narrow = trainer(copy_of(base, models::head_kind::lm), train::precision::bf16);
  EXPECT_EQ(narrow->compute_precision(), train::precision::bf16);
  for (const auto& p : narrow->model()->parameters())
    EXPECT_EQ(p.scalar_type(), at::kBFloat16);
  const auto start = flat_weights(*narrow), wide_start = flat_weights(*wide);
  double first = 0, last = 0, worst = 0;
  for (int step = 0; step < 10; ++step) {
    auto batch = fixed_batch(8, 40 + static_cast<uint64_t>(step % 2));
    auto a = wide->sft_step(batch), b = narrow->sft_step(batch);
    ASSERT_TRUE(a && b);
    const double la = a->at("sft/loss"), lb = b->at("sft/loss");
    worst = std::max(worst, std::abs(la - lb) / la);
    first = step == 0 ? la : first;
    last = la;
  }
  const auto moved_wide = flat_weights(*wide) - wide_start;
  const auto moved_narrow = flat_weights(*narrow) - start;
  const double change =
      (moved_narrow - moved_wide).norm().item<double>() / moved_wide.norm().item<double>();
  std::printf("bf16 vs fp32 over 10 steps: loss %.2e (relative, worst step), weight change "
              "%.2e (relative L2)\n",
              worst, change);
  EXPECT_LT(last, first * 0.9) << "the test must train";
  EXPECT_LT(worst, 1e-2);
  EXPECT_LT(change, 0.1);
  // The passes answer fp32 whatever the weights: log-probs and values.
  auto lp = narrow->log_probs(fixed_batch(3, 9), 1.0, false);
  ASSERT_TRUE(lp) << describe(lp.error());
  EXPECT_EQ(lp->get("log_probs")->scalar_type(), at::kFloat);
}

// Updates below half a bf16 step of a weight accumulate in the fp32 master:
// after five steps at lr 1e-4 the norms' weights (1.0, whose bf16 neighbours
// are 2^-8 and 2^-7 away) have not moved in bf16, their masters have, and
// the weights are always the masters rounded.
TEST(MixedPrecision, UpdatesTooSmallForBf16AccumulateInTheMasters) {
  auto e = trainer(tiny_model(22), train::precision::bf16, 1e-4);
  const auto before = flat_weights(*e);
  for (int step = 0; step < 5; ++step)
    ASSERT_TRUE(e->sft_step(fixed_batch(8, 50)));
  auto state = e->save_state();
  ASSERT_TRUE(state) << describe(state.error());
  auto t = state_tensors(*state);
  ASSERT_TRUE(t.count("optimizer/master"));
  const auto master = t.at("optimizer/master");
  EXPECT_EQ(master.scalar_type(), at::kFloat);
  EXPECT_EQ(t.at("optimizer/exp_avg").scalar_type(), at::kFloat);
  const auto now = flat_weights(*e);
  EXPECT_TRUE(torch::equal(now, master.to(at::kBFloat16).to(at::kFloat)));
  auto ones = before.eq(1.0);
  ASSERT_GT(ones.sum().item<int64_t>(), 0);
  EXPECT_TRUE(torch::equal(now.masked_select(ones), before.masked_select(ones)))
      << "a norm weight moved in bf16: the test's lr is too large";
  EXPECT_GT((master - before).masked_select(ones).abs().max().item<double>(), 2e-4)
      << "the masters did not accumulate the small updates";
}

// A bf16 state (weights, masters, moments) loads bit-identically into a bf16
// engine, which then steps as the original; loaded into an fp32 engine its
// weights are the masters.
TEST(MixedPrecision, AStateCarriesItsMastersAcrossPrecisions) {
  auto a = trainer(tiny_model(23), train::precision::bf16);
  auto batch = fixed_batch(6, 60);
  for (int step = 0; step < 3; ++step)
    ASSERT_TRUE(a->sft_step(batch));
  auto state = a->save_state();
  ASSERT_TRUE(state) << describe(state.error());
  auto b = trainer(tiny_model(24), train::precision::bf16);
  ASSERT_TRUE(b->load_state(*state));
  auto again = b->save_state();
  ASSERT_TRUE(again);
  auto ta = state_tensors(*state), tb = state_tensors(*again);
  for (const auto& key : {"optimizer/master", "optimizer/exp_avg", "optimizer/exp_avg_sq"})
    EXPECT_TRUE(torch::equal(ta.at(key), tb.at(key))) << key;
  auto ma = a->sft_step(batch), mb = b->sft_step(batch);
  ASSERT_TRUE(ma && mb);
  EXPECT_EQ(ma->at("sft/loss"), mb->at("sft/loss"));
  EXPECT_TRUE(torch::equal(flat_weights(*a), flat_weights(*b)));

  // The same through a shard (NOTE [sharded state]: "shard/master").
  auto shard = a->save_shard();
  ASSERT_TRUE(shard) << describe(shard.error());
  auto d = trainer(tiny_model(29), train::precision::bf16);
  ASSERT_TRUE(d->load_shards({*shard}));
  auto from_shard = d->save_state();
  ASSERT_TRUE(from_shard);
  auto td = state_tensors(*from_shard), now = state_tensors(*a->save_state());
  for (const auto& key : {"optimizer/master", "optimizer/exp_avg", "optimizer/exp_avg_sq"})
    EXPECT_TRUE(torch::equal(now.at(key), td.at(key))) << key;

  auto c = trainer(tiny_model(25), train::precision::fp32);
  ASSERT_TRUE(c->load_state(*state));
  EXPECT_TRUE(torch::equal(flat_weights(*c), ta.at("optimizer/master")));
}

TEST(MixedPrecision, PrecisionIsSetBeforeTrainingAndNotUndone) {
  auto e = trainer(tiny_model(26), train::precision::fp32);
  ASSERT_TRUE(e->sft_step(fixed_batch(4, 70)));
  auto late = e->set_precision(train::precision::bf16);
  ASSERT_FALSE(late);
  EXPECT_NE(describe(late.error()).find("before"), std::string::npos) << describe(late.error());
  auto f = trainer(tiny_model(27), train::precision::bf16);
  auto back = f->set_precision(train::precision::fp32);
  ASSERT_FALSE(back);
  EXPECT_NE(describe(back.error()).find("cannot be undone"), std::string::npos);
  // A frozen engine computes in bf16 too (a reference or reward model).
  auto frozen = train::train_engine::make(tiny_model(28), std::nullopt);
  ASSERT_TRUE(frozen);
  ASSERT_TRUE((*frozen)->set_precision(train::precision::bf16));
  auto lp = (*frozen)->log_probs(fixed_batch(2, 71), 1.0, false);
  ASSERT_TRUE(lp) << describe(lp.error());
}
