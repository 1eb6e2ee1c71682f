#include "kernels/losses.hpp"

#include "tests/kernels/test_util.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <numeric>

using namespace troupe;
using namespace troupe::kernels;
using namespace troupe::kernels::testing;

namespace {

// One row of four tokens:
//   t0: A = 1,  r = 1.5 → −1.5 vs −1.2: clipped term chosen (−1.2)
//   t1: A = −1, r = 0.5 → 0.5 vs 0.8:   clipped term chosen (0.8); dual cap 3 not hit
//   t2: A = −1, r = 4   → 4 vs 1.2:     unclipped (4); dual clip caps it at −c·A = 3
//   t3: A = 2,  r = 1   → −2
struct ppo_case {
  at::Tensor old_lp = mat({{-1.0, -1.0, -1.0, -1.0}});
  at::Tensor lp = old_lp + mat({{std::log(1.5), std::log(0.5), std::log(4.0), 0.0}});
  at::Tensor adv = mat({{1.0, -1.0, -1.0, 2.0}});
  at::Tensor mask = torch::ones({1, 4});
};

} // namespace

TEST(ppo_policy_loss, ratio_one_gives_minus_mean_advantage_and_no_clipping) {
  torch::manual_seed(3);
  auto lp = torch::randn({3, 6});
  auto adv = torch::randn({3, 6});
  auto mask = torch::ones({3, 6});
  mask.slice(1, 4, 6).zero_();
  auto out = value_of(ppo_policy_loss(lp, lp.clone(), adv, mask));
  expect_close(out.loss, {-scalar((adv * mask).sum() / mask.sum())}, 1e-6);
  EXPECT_EQ(scalar(out.pg_clipfrac), 0.0);
  EXPECT_EQ(scalar(out.pg_clipfrac_lower), 0.0);
  EXPECT_EQ(scalar(out.ppo_kl), 0.0);
}

TEST(ppo_policy_loss, clipping_and_dual_clip_hand_computed) {
  ppo_case c;
  auto out = value_of(ppo_policy_loss(c.lp, c.old_lp, c.adv, c.mask));
  expect_close(out.loss, {(-1.2 + 0.8 + 3.0 - 2.0) / 4}, 1e-6);
  expect_close(out.pg_clipfrac, {0.5}, 1e-7);
  expect_close(out.pg_clipfrac_lower, {0.25}, 1e-7);
  expect_close(out.ppo_kl, {-(std::log(1.5) + std::log(0.5) + std::log(4.0)) / 4}, 1e-6);

  auto no_dual =
      value_of(ppo_policy_loss(c.lp, c.old_lp, c.adv, c.mask, {.dual_clip_c = std::nullopt}));
  expect_close(no_dual.loss, {(-1.2 + 0.8 + 4.0 - 2.0) / 4}, 1e-6);
  EXPECT_EQ(scalar(no_dual.pg_clipfrac_lower), 0.0);

  // Asymmetric clip: ratio floored at 0.9 for t1, capped at 1.28 for t0.
  auto asym = value_of(
      ppo_policy_loss(c.lp, c.old_lp, c.adv, c.mask, {.clip_low = 0.1, .clip_high = 0.28}));
  expect_close(asym.loss, {(-1.28 + 0.9 + 3.0 - 2.0) / 4}, 1e-6);
}

TEST(ppo_policy_loss, gradient_flows_only_through_unclipped_tokens) {
  ppo_case c;
  auto lp = c.lp.clone().requires_grad_(true);
  value_of(ppo_policy_loss(lp, c.old_lp, c.adv, c.mask)).loss.backward();
  // Only t3 is unclipped: d(−A·r)/dlogp = −A·r = −2, over 4 tokens.
  expect_close(lp.grad(), {0.0, 0.0, 0.0, -0.5}, 1e-6);
}

TEST(ppo_policy_loss, aggregation_modes_and_mask) {
  // Ratio 1: per-token loss −A. Row 0 valid [−1, −2], row 1 valid [−4].
  auto lp = torch::zeros({2, 3});
  auto adv = mat({{1, 2, 100}, {4, 100, 100}});
  auto mask = mat({{1, 1, 0}, {1, 0, 0}});
  auto loss = [&](loss_agg_mode mode) {
    return scalar(value_of(ppo_policy_loss(lp, lp, adv, mask, {.agg = mode})).loss);
  };
  EXPECT_NEAR(loss(loss_agg_mode::token_mean), -7.0 / 3, 1e-6);
  EXPECT_NEAR(loss(loss_agg_mode::seq_mean_token_sum), -(3.0 + 4.0) / 2, 1e-6);
  EXPECT_NEAR(loss(loss_agg_mode::seq_mean_token_mean), -(1.5 + 4.0) / 2, 1e-6);
}

TEST(value_loss, clipped_hand_computed) {
  // t0: v 1.5 clipped to 1.0 (old 0.8 ± 0.2), R 2: max(0.25, 1) = 1, clipped chosen
  // t1: v 2.0 clipped to 2.3 (old 2.5 ± 0.2), R 2: max(0, 0.09) = 0.09, clipped chosen
  // t2: v 0 within 0 ± 0.2, R 1: 1, equal terms (not counted)
  auto values = mat({{1.5, 2.0, 0.0, 7.0}});
  auto old = mat({{0.8, 2.5, 0.0, 0.0}});
  auto returns = mat({{2.0, 2.0, 1.0, 0.0}});
  auto mask = mat({{1, 1, 1, 0}});
  auto out = value_of(value_loss(values, old, returns, mask));
  expect_close(out.loss, {0.5 * (1.0 + 0.09 + 1.0) / 3}, 1e-6);
  expect_close(out.vf_clipfrac, {2.0 / 3}, 1e-6);
  auto plain = value_of(value_loss(values, old, returns, mask, {.clip = std::nullopt}));
  expect_close(plain.loss, {0.5 * (0.25 + 0.0 + 1.0) / 3}, 1e-6);
  EXPECT_EQ(scalar(plain.vf_clipfrac), 0.0);
  auto v = values.clone().requires_grad_(true);
  value_of(value_loss(v, old, returns, mask, {.clip = std::nullopt})).loss.backward();
  // d/dv ½·mean((v − R)²) = (v − R)/3.
  expect_close(v.grad(), {-0.5 / 3, 0.0, -1.0 / 3, 0.0}, 1e-6);
}

TEST(entropy_bonus, aggregated_entropy) {
  auto h = mat({{1, 2, 9}, {3, 9, 9}});
  auto mask = mat({{1, 1, 0}, {1, 0, 0}});
  expect_close(value_of(entropy_bonus(h, mask)), {2.0}, 1e-6);
  expect_close(value_of(entropy_bonus(h, mask, loss_agg_mode::seq_mean_token_mean)), {2.25}, 1e-6);
}

TEST(kl_loss, aggregated_estimator) {
  auto lp = mat({{-1.0, -0.5, 5.0}});
  auto ref = mat({{-1.2, -0.5, 0.0}});
  auto mask = mat({{1, 1, 0}});
  expect_close(value_of(kl_loss(lp, ref, mask, kl_estimator::k1)), {0.1}, 1e-6);
  expect_close(value_of(kl_loss(lp, ref, mask, kl_estimator::k2)), {0.01}, 1e-6);
  expect_close(value_of(kl_loss(lp, ref, mask, kl_estimator::k3)), {(std::exp(-0.2) + 0.2 - 1) / 2},
               1e-6);
}

TEST(token_level_rewards, seed_reward_calculator_example) {
  // Seed Ch 13 reward_calculator: β = 0.02, rm = 0.5 → total KL −0.2,
  // last-token reward 0.5060, net total reward 0.5040.
  auto actor = mat({{-1.2, -0.8, -1.5, -0.9, -1.1, -1.0, -0.7, -1.3}});
  auto ref = mat({{-1.0, -1.0, -1.2, -1.0, -1.0, -1.1, -1.0, -1.0}});
  auto out = value_of(token_level_rewards(vec({0.5}), actor, ref, torch::ones({1, 8}), 0.02));
  expect_close(out.kl, {-0.2, 0.2, -0.3, 0.1, -0.1, 0.1, 0.3, -0.3}, 1e-6);
  EXPECT_NEAR(scalar(out.kl.sum()), -0.2, 1e-6);
  EXPECT_NEAR(scalar(out.rewards[0][7]), 0.5060, 1e-6);
  EXPECT_NEAR(scalar(out.rewards.sum()), 0.5040, 1e-6);
  EXPECT_NEAR(scalar((-0.02 * out.kl).sum()), 0.0040, 1e-7);
}

TEST(token_level_rewards, seed_kl_coefficient_sweep) {
  auto actor = mat({{-1.0, -1.2, -0.8, -1.5, -0.9}});
  auto ref = mat({{-1.1, -1.0, -1.0, -1.2, -1.0}});
  const std::vector<std::pair<double, double>> sweep{{0.0, 0.5},    {0.01, 0.501}, {0.02, 0.502},
                                                     {0.05, 0.505}, {0.1, 0.51},   {0.5, 0.55}};
  for (auto [beta, net] : sweep) {
    auto out = value_of(token_level_rewards(vec({0.5}), actor, ref, torch::ones({1, 5}), beta));
    EXPECT_NEAR(scalar(out.rewards.sum()), net, 1e-6) << "beta " << beta;
  }
}

TEST(token_level_rewards, seed_scenarios_batched_with_padding) {
  // Total KL 0, 0.7, 2.3, −3.5 at β = 0.02, rm 0.5 → net 0.5, 0.486, 0.454, 0.57.
  // Rows have 1, 2, 3 and 2 valid tokens; the score lands on the last valid one.
  auto ref = torch::zeros({4, 3});
  auto actor = mat({{0.0, 9, 9}, {0.3, 0.4, 9}, {1.0, 1.0, 0.3}, {-2.0, -1.5, 9}});
  auto mask = mat({{1, 0, 0}, {1, 1, 0}, {1, 1, 1}, {1, 1, 0}});
  auto out = value_of(token_level_rewards(vec({0.5, 0.5, 0.5, 0.5}), actor, ref, mask, 0.02));
  expect_close(out.rewards.sum(1), {0.5, 0.486, 0.454, 0.57}, 1e-6);
  expect_close(out.rewards.select(1, 2), {0.0, 0.0, 0.5 - 0.02 * 0.3, 0.0}, 1e-6);
  expect_close(out.kl.select(1, 2), {0.0, 0.0, 0.3, 0.0}, 1e-6);
}

TEST(token_level_rewards, score_goes_to_last_valid_token_even_with_holes) {
  auto lp = torch::zeros({2, 4});
  auto mask = mat({{1, 0, 1, 0}, {0, 0, 0, 0}});
  auto out = value_of(token_level_rewards(vec({2.0, 3.0}), lp, lp, mask, 0.1));
  expect_close(out.rewards, {0, 0, 2.0, 0, 0, 0, 0, 0}, 0);
}

TEST(losses, reject_bad_arguments) {
  ppo_case c;
  expect_error(ppo_policy_loss(c.lp, c.old_lp, torch::ones({1, 3}), c.mask), errc::shape_mismatch,
               "ppo_policy_loss: advantages has shape [1, 3], expected [1, 4] like log_probs");
  expect_error(ppo_policy_loss(c.lp, c.old_lp, c.adv, c.mask, {.dual_clip_c = 1.0}),
               errc::invalid_argument, "ppo_policy_loss: dual_clip_c must be in (1, inf), got 1");
  expect_error(ppo_policy_loss(c.lp, c.old_lp, c.adv, c.mask, {.clip_low = 1.0}),
               errc::invalid_argument, "clip_low must be in [0, 1), got 1");
  expect_error(ppo_policy_loss(c.lp, c.old_lp, c.adv, c.mask, {.clip_high = -0.1}),
               errc::invalid_argument, "clip_high must be in [0, inf)");
  expect_error(value_loss(c.lp, c.lp, c.lp, c.mask, {.clip = 0.0}), errc::invalid_argument,
               "value_loss: clip must be in (0, inf), got 0");
  expect_error(value_loss(c.lp, c.lp, c.lp, torch::ones({4})), errc::shape_mismatch,
               "value_loss: mask has shape [4], expected [1, 4] like values");
  expect_error(token_level_rewards(vec({1, 2}), c.lp, c.lp, c.mask, 0.02), errc::shape_mismatch,
               "token_level_rewards: scores has shape [2], expected [1]");
  expect_error(token_level_rewards(vec({1}), c.lp, c.lp, c.mask, -0.02), errc::invalid_argument,
               "token_level_rewards: beta must be in [0, inf), got -0.02");
  expect_error(kl_loss(c.lp, torch::ones({4}), c.mask), errc::shape_mismatch,
               "kl_loss: ref_log_probs has shape [4], expected [1, 4] like log_probs");
  expect_error(entropy_bonus(torch::ones({4}), torch::ones({4})), errc::shape_mismatch,
               "entropy_bonus: aggregate_loss: loss has shape [4]");
}
