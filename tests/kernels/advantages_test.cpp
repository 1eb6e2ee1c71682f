#include "kernels/advantages.hpp"

#include "tests/kernels/test_util.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

using namespace troupe;
using namespace troupe::kernels;
using namespace troupe::kernels::testing;

TEST(contiguous_group_ids, consecutive_samples_share_an_id) {
  auto ids = value_of(contiguous_group_ids(6, 3));
  EXPECT_EQ(ids.scalar_type(), torch::kLong);
  expect_close(ids, {0, 0, 0, 1, 1, 1}, 0);
  expect_error(contiguous_group_ids(5, 3), errc::invalid_argument,
               "contiguous_group_ids: batch 5 must be a non-negative multiple of group_size 3");
  expect_error(contiguous_group_ids(4, 0), errc::invalid_argument);
}

TEST(grpo_advantages, group_normalised_scores_broadcast_over_mask) {
  // Group 0: [1, 2, 3] → mean 2, unbiased std 1. Group 1: all equal → 0.
  auto scores = vec({1, 2, 3, 4, 4, 4});
  auto mask = torch::ones({6, 2});
  mask.index_put_({0, 1}, 0);
  auto ids = value_of(contiguous_group_ids(6, 3));
  auto out = value_of(grpo_advantages(scores, mask, ids));
  double a = 1.0 / (1.0 + 1e-6);
  expect_close(out.advantages, {-a, 0, 0, 0, a, a, 0, 0, 0, 0, 0, 0}, 1e-6);
  expect_close(out.returns, out.advantages, 0);
  auto plain = value_of(grpo_advantages(scores, mask, ids, {.norm_by_std = false}));
  expect_close(plain.advantages, {-1, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0}, 1e-6);
}

TEST(grpo_advantages, arbitrary_group_ids_and_singletons) {
  // ids 7: {1, 3} (std √2), ids 3: {10, 20} (std √50), id 5: a single sample:
  // NOTE [groups of one] mean 0, std 1 → 42 / (1 + eps), as verl.
  auto scores = vec({1, 10, 3, 20, 42});
  auto ids = torch::tensor({7, 3, 7, 3, 5}, torch::kLong);
  auto out = value_of(grpo_advantages(scores, torch::ones({5, 1}), ids));
  double a = 1.0 / (std::sqrt(2.0) + 1e-6);
  double b = 5.0 / (std::sqrt(50.0) + 1e-6);
  expect_close(out.advantages, {-a, -b, a, b, 42.0 / (1 + 1e-6)}, 1e-5);
  // Dr. GRPO (no std): the deviation from the group mean; a singleton its score.
  auto dr = value_of(grpo_advantages(scores, torch::ones({5, 1}), ids, {.norm_by_std = false}));
  expect_close(dr.advantages, {-1, -5, 1, 5, 42}, 1e-6);
  expect_close(value_of(singleton_groups(ids)), {4}, 0);
  EXPECT_EQ(value_of(singleton_groups(value_of(contiguous_group_ids(4, 2)))).numel(), 0);
  expect_close(value_of(singleton_groups(value_of(contiguous_group_ids(3, 1)))), {0, 1, 2}, 0);
  // Through estimate_advantages, norm_by_std is the switch.
  advantage_inputs in;
  in.scores = scores;
  in.mask = torch::ones({5, 1});
  in.group_ids = ids;
  in.norm_by_std = false;
  expect_close(value_of(estimate_advantages(advantage_estimator::grpo, in)).advantages,
               dr.advantages, 0);
}

TEST(rloo_advantages, score_minus_mean_of_others) {
  // [1, 2, 3]: 1 − 2.5, 2 − 2, 3 − 1.5; a singleton group keeps its score.
  auto scores = vec({1, 2, 3, 9});
  auto ids = torch::tensor({0, 0, 0, 1}, torch::kLong);
  auto out = value_of(rloo_advantages(scores, mat({{1, 1}, {1, 0}, {1, 1}, {1, 1}}), ids));
  expect_close(out.advantages, {-1.5, -1.5, 0, 0, 1.5, 1.5, 9, 9}, 1e-6);
}

TEST(reinforce_pp_advantages, whitened_discounted_returns) {
  // γ = 0.5: returns [0.25, 0.5, 1] and [0.5, 1, (pad)]; valid mean 0.65, unbiased var 0.1125.
  auto rewards = mat({{0, 0, 1}, {0, 1, 5}});
  auto mask = mat({{1, 1, 1}, {1, 1, 0}});
  auto out = value_of(reinforce_pp_advantages(rewards, mask, 0.5));
  expect_close(out.returns, {0.25, 0.5, 1, 0.5, 1, 0}, 1e-6);
  double sd = std::sqrt(0.1125 + 1e-8);
  expect_close(out.advantages,
               {(0.25 - 0.65) / sd, (0.5 - 0.65) / sd, (1 - 0.65) / sd, (0.5 - 0.65) / sd,
                (1 - 0.65) / sd, 0},
               1e-5);
}

TEST(reinforce_pp_baseline_advantages, group_centred_then_whitened) {
  // Centred scores [−1, 1, 0, 0] over 2 tokens each: mean 0, unbiased var 4/7.
  auto out = value_of(reinforce_pp_baseline_advantages(vec({1, 3, 2, 2}), torch::ones({4, 2}),
                                                       torch::tensor({0, 0, 1, 1}, torch::kLong)));
  double a = 1.0 / std::sqrt(4.0 / 7.0 + 1e-8);
  expect_close(out.advantages, {-a, -a, a, a, 0, 0, 0, 0}, 1e-5);
}

TEST(remax_advantages, reward_to_go_minus_greedy_baseline) {
  // Scores on the last valid token: reward-to-go = the score on every token.
  auto mask = mat({{1, 1, 0}, {1, 0, 0}});
  auto out = value_of(remax_advantages(mat({{0, 1, 0}, {0.5, 0, 0}}), vec({0.25, 1}), mask));
  expect_close(out.advantages, {0.75, 0.75, 0, -0.5, 0, 0}, 1e-6);
  expect_close(out.returns, {1, 1, 0, 0.5, 0, 0}, 1e-6);
  // Per-token scores (and a KL penalty) count from where they fall; what is
  // outside the mask counts nowhere.
  auto dense = value_of(remax_advantages(mat({{0.5, -0.25, 7}, {2, 7, 7}}), vec({0.5, 1}), mask));
  expect_close(dense.returns, {0.25, -0.25, 0, 2, 0, 0}, 1e-6);
  expect_close(dense.advantages, {-0.25, -0.75, 0, 1, 0, 0}, 1e-6);
  // Through estimate_advantages it needs the baseline.
  advantage_inputs in;
  in.token_rewards = mat({{0, 1, 0}, {0.5, 0, 0}});
  in.mask = mask;
  expect_error(estimate_advantages(advantage_estimator::remax, in), errc::invalid_argument,
               "baseline");
  in.baseline_scores = vec({0.25, 1});
  expect_close(value_of(estimate_advantages(advantage_estimator::remax, in)).advantages,
               out.advantages, 0);
}

TEST(reinforce_pp_baseline_advantages, a_sample_alone_keeps_its_score_before_whitening) {
  // Centred [−1, 1] and the singleton's 3 (mean 0): mean 1, unbiased var 4 over 3 tokens.
  auto out = value_of(reinforce_pp_baseline_advantages(vec({1, 3, 3}), torch::ones({3, 1}),
                                                       torch::tensor({0, 0, 1}, torch::kLong)));
  double sd = std::sqrt(4.0 + 1e-8);
  expect_close(out.advantages, {-2 / sd, 0, 2 / sd}, 1e-6);
}

TEST(advantages, reject_bad_arguments) {
  auto ids = torch::tensor({0, 0, 1}, torch::kLong);
  expect_error(grpo_advantages(vec({1, 2, 3}), torch::ones({2, 4}), ids), errc::shape_mismatch,
               "grpo_advantages: scores has shape [3], expected [2] (one per row of mask [2, 4])");
  expect_error(grpo_advantages(vec({1, 2, 3}), torch::ones({3, 4}), torch::zeros({3})),
               errc::shape_mismatch, "group_ids has dtype Float");
  expect_error(
      rloo_advantages(vec({1, 2, 3}), torch::ones({3, 4}), torch::zeros({2}, torch::kLong)),
      errc::shape_mismatch, "group_ids has shape [2], expected [3] like scores");
  expect_error(grpo_advantages(torch::ones({3, 1}), torch::ones({3, 4}), ids), errc::shape_mismatch,
               "scores has shape [3, 1], expected 1 dimensions [B]");
  expect_error(reinforce_pp_advantages(torch::ones({2, 3}), torch::ones({2, 3}), 1.1),
               errc::invalid_argument, "gamma must be in [0, 1]");
  expect_error(remax_advantages(torch::ones({2, 3}), vec({1}), torch::ones({2, 3})),
               errc::shape_mismatch,
               "baseline_scores has shape [1], expected [2] (one per row of mask [2, 3])");
  expect_error(remax_advantages(torch::ones({2, 4}), vec({1, 2}), torch::ones({2, 3})),
               errc::shape_mismatch, "token_rewards has shape [2, 4]");
}
