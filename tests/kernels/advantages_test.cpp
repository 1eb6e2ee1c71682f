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
  // ids 7: {1, 3} (std √2), ids 3: {10, 20} (std √50), id 5: a single sample → 0.
  auto scores = vec({1, 10, 3, 20, 42});
  auto ids = torch::tensor({7, 3, 7, 3, 5}, torch::kLong);
  auto out = value_of(grpo_advantages(scores, torch::ones({5, 1}), ids));
  double a = 1.0 / (std::sqrt(2.0) + 1e-6);
  double b = 5.0 / (std::sqrt(50.0) + 1e-6);
  expect_close(out.advantages, {-a, -b, a, b, 0}, 1e-6);
}

TEST(rloo_advantages, score_minus_mean_of_others) {
  // [1, 2, 3]: 1 − 2.5, 2 − 2, 3 − 1.5; a singleton group → 0.
  auto scores = vec({1, 2, 3, 9});
  auto ids = torch::tensor({0, 0, 0, 1}, torch::kLong);
  auto out = value_of(rloo_advantages(scores, mat({{1, 1}, {1, 0}, {1, 1}, {1, 1}}), ids));
  expect_close(out.advantages, {-1.5, -1.5, 0, 0, 1.5, 1.5, 0, 0}, 1e-6);
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

TEST(remax_advantages, score_minus_greedy_baseline) {
  auto out = value_of(remax_advantages(vec({1, 0.5}), vec({0.25, 1}), mat({{1, 1, 0}, {1, 0, 0}})));
  expect_close(out.advantages, {0.75, 0.75, 0, -0.5, 0, 0}, 1e-6);
  expect_close(out.returns, {1, 1, 0, 0.5, 0, 0}, 1e-6);
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
  expect_error(remax_advantages(vec({1, 2}), vec({1}), torch::ones({2, 3})), errc::shape_mismatch,
               "baseline_scores has shape [1], expected [2] like scores");
}
