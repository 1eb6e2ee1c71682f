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

// Under the additive modes the per-token losses −A are summed (token-sum) or
// summed and divided by the factor (seq-mean-token-sum-norm: default the 3
// columns); each valid token's gradient is −A·r / factor.
TEST(ppo_policy_loss, additive_aggregation_value_and_gradient) {
  auto adv = mat({{1, 2, 100}, {4, 100, 100}});
  auto mask = mat({{1, 1, 0}, {1, 0, 0}});
  auto run = [&](policy_loss_options o) {
    auto lp = torch::zeros({2, 3}).requires_grad_(true);
    auto loss = value_of(ppo_policy_loss(lp, torch::zeros({2, 3}), adv, mask, o)).loss;
    loss.backward();
    return std::pair{scalar(loss), lp.grad()};
  };
  auto [sum, gsum] = run({.agg = loss_agg_mode::token_sum});
  EXPECT_NEAR(sum, -7.0, 1e-6);
  expect_close(gsum, {-1, -2, 0, -4, 0, 0}, 1e-6);
  auto [norm, gnorm] = run({.agg = loss_agg_mode::seq_mean_token_sum_norm});
  EXPECT_NEAR(norm, -7.0 / 3, 1e-6);
  expect_close(gnorm, {-1.0 / 3, -2.0 / 3, 0, -4.0 / 3, 0, 0}, 1e-6);
  auto [scaled, gscaled] =
      run({.agg = loss_agg_mode::seq_mean_token_sum_norm, .loss_scale_factor = 7});
  EXPECT_NEAR(scaled, -1.0, 1e-6);
  expect_close(gscaled, {-1.0 / 7, -2.0 / 7, 0, -4.0 / 7, 0, 0}, 1e-6);
}

namespace {

// GSPO / CISPO cases. Row 0: log-ratios ln 1.1, ln 1.3 (A = 1); row 1: ln 0.5,
// ln 0.5 and a masked token (A = −1).
struct sequence_case {
  at::Tensor old_lp = mat({{-1.0, -2.0, -1.0}, {-1.0, -1.0, -1.0}});
  at::Tensor lp =
      old_lp + mat({{std::log(1.1), std::log(1.3), 0.0}, {std::log(0.5), std::log(0.5), 5.0}});
  at::Tensor adv = mat({{1, 1, 1}, {-1, -1, -1}});
  at::Tensor mask = mat({{1, 1, 0}, {1, 1, 0}});
};

} // namespace

// GSPO: s_0 = √(1.1·1.3) = 1.1958 (inside 1 ± 0.2): −A·s = −1.1958 on each of
// row 0's tokens; s_1 = 0.5 with A = −1: −A·clip(0.5) = 0.8 chosen over 0.5
// (clipped). seq-mean-token-mean: (−1.1958 + 0.8) / 2. The gradient is the
// paper's: s_0·(−A) / |y_0| / 2 sequences on row 0's tokens, 0 on the clipped
// row — where PPO would clip row 0's second token (ratio 1.3).
TEST(gspo_policy_loss, sequence_ratio_value_and_gradient) {
  sequence_case c;
  const double s0 = std::sqrt(1.1 * 1.3);
  auto lp = c.lp.clone().requires_grad_(true);
  auto out = value_of(gspo_policy_loss(lp, c.old_lp, c.adv, c.mask));
  expect_close(out.loss, {(-s0 + 0.8) / 2}, 1e-6);
  expect_close(out.pg_clipfrac, {0.5}, 1e-7);
  EXPECT_EQ(scalar(out.pg_clipfrac_lower), 0.0);
  expect_close(out.ppo_kl, {-(std::log(1.1) + std::log(1.3) + 2 * std::log(0.5)) / 4}, 1e-6);
  out.loss.backward();
  expect_close(lp.grad(), {-s0 / 4, -s0 / 4, 0, 0, 0, 0}, 1e-6);
  // The loss_agg option does not apply: GSPO is sequence-level by definition.
  auto same =
      value_of(gspo_policy_loss(c.lp, c.old_lp, c.adv, c.mask, {.agg = loss_agg_mode::token_sum}));
  expect_close(same.loss, out.loss, 1e-7);
  // A sequence ratio past 1 + ε_high is clipped (A > 0): s_0 > 1.1.
  auto tight = value_of(gspo_policy_loss(c.lp, c.old_lp, c.adv, c.mask, {.clip_high = 0.1}));
  expect_close(tight.loss, {(-1.1 + 0.8) / 2}, 1e-6);
}

// CISPO: weights clip(r, 0.8, 1.28) = [1.1, 1.28] and [0.8, 0.8], detached;
// per token −A·w·logp; token-mean over 4. Every token keeps a gradient,
// −A·w/4 (PPO's clipped tokens have none).
TEST(cispo_policy_loss, clipped_weight_times_log_prob_value_and_gradient) {
  sequence_case c;
  policy_loss_options o{.clip_low = 0.2, .clip_high = 0.28};
  auto lp = c.lp.clone().requires_grad_(true);
  auto out = value_of(cispo_policy_loss(lp, c.old_lp, c.adv, c.mask, o));
  auto l = c.lp;
  double want = (-1.1 * scalar(l[0][0]) - 1.28 * scalar(l[0][1]) + 0.8 * scalar(l[1][0]) +
                 0.8 * scalar(l[1][1])) /
                4;
  expect_close(out.loss, {want}, 1e-6);
  expect_close(out.pg_clipfrac, {0.75}, 1e-7);
  out.loss.backward();
  expect_close(lp.grad(), {-1.1 / 4, -1.28 / 4, 0, 0.8 / 4, 0.8 / 4, 0}, 1e-6);
  // clip_low >= 1 leaves no floor (the paper's choice): row 1 weighs 0.5.
  auto lp2 = c.lp.clone().requires_grad_(true);
  value_of(cispo_policy_loss(lp2, c.old_lp, c.adv, c.mask, {.clip_low = 1.0, .clip_high = 0.28}))
      .loss.backward();
  expect_close(lp2.grad(), {-1.1 / 4, -1.28 / 4, 0, 0.5 / 4, 0.5 / 4, 0}, 1e-6);
  expect_error(ppo_policy_loss(c.lp, c.old_lp, c.adv, c.mask, {.clip_low = 1.0}),
               errc::invalid_argument, "clip_low must be in [0, 1)");
}

// actor_loss: the spec's policy loss − entropy_coef·entropy + kl_coef·KL,
// every term aggregated by the effective mode (gspo: seq-mean-token-mean).
TEST(actor_loss, composes_the_terms_of_the_spec) {
  sequence_case c;
  auto entropy = mat({{1, 3, 50}, {2, 2, 50}});
  auto ref = c.lp - 0.5;
  actor_loss_inputs in{c.lp, c.old_lp, c.adv, c.mask, entropy, ref};
  for (auto kind : {policy_loss_kind::ppo, policy_loss_kind::gspo, policy_loss_kind::cispo}) {
    SCOPED_TRACE(std::string{to_string(kind)});
    policy_loss_spec spec{.kind = kind,
                          .options = {.agg = loss_agg_mode::token_sum},
                          .entropy_coef = 0.1,
                          .kl_coef = 0.5,
                          .kl = kl_estimator::k1};
    auto out = value_of(actor_loss(in, spec));
    const bool gspo = kind == policy_loss_kind::gspo;
    EXPECT_EQ(effective_agg(spec),
              gspo ? loss_agg_mode::seq_mean_token_mean : loss_agg_mode::token_sum);
    // token-sum: entropy 8, KL 4 × 0.5 = 2; seq-mean-token-mean: 2, 0.5.
    expect_close(out.entropy, {gspo ? 2.0 : 8.0}, 1e-6);
    expect_close(out.kl_loss, {gspo ? 0.5 : 2.0}, 1e-6);
    expect_close(out.loss, out.pg.loss - 0.1 * out.entropy + 0.5 * out.kl_loss, 1e-6);
  }
  // Without a KL coefficient there is no KL term; with one, the reference is needed.
  auto plain = value_of(actor_loss({c.lp, c.old_lp, c.adv, c.mask, {}, {}}, {}));
  EXPECT_FALSE(plain.kl_loss.defined());
  EXPECT_FALSE(plain.entropy.defined());
  expect_close(plain.loss, plain.pg.loss, 0);
  expect_error(actor_loss({c.lp, c.old_lp, c.adv, c.mask, {}, {}}, {.kl_coef = 0.1}),
               errc::invalid_argument, "reference");
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
