#include "kernels/masked.hpp"

#include "tests/kernels/test_util.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

using namespace troupe;
using namespace troupe::kernels;
using namespace troupe::kernels::testing;

namespace {

// Valid elements 1, 2, 5, 6, 7: sum 21, mean 4.2, Σ(x − μ)² = 26.8.
at::Tensor data() {
  return mat({{1, 2, 3, 4}, {5, 6, 7, 8}});
}
at::Tensor mask() {
  return mat({{1, 1, 0, 0}, {1, 1, 1, 0}});
}

} // namespace

TEST(masked, sum_mean_var_hand_computed) {
  expect_close(value_of(masked_sum(data(), mask())), {21.0}, 1e-6);
  expect_close(value_of(masked_sum(data(), mask(), 1)), {3.0, 18.0}, 1e-6);
  expect_close(value_of(masked_mean(data(), mask())), {4.2}, 1e-6);
  expect_close(value_of(masked_mean(data(), mask(), 1)), {1.5, 6.0}, 1e-6);
  expect_close(value_of(masked_mean(data(), mask(), -1)), {1.5, 6.0}, 1e-6);
  expect_close(value_of(masked_mean(data(), mask(), 0)), {3.0, 4.0, 7.0, 0.0}, 1e-6);
  expect_close(value_of(masked_var(data(), mask())), {26.8 / 4}, 1e-5);
  expect_close(value_of(masked_var(data(), mask(), /*unbiased=*/false)), {26.8 / 5}, 1e-5);
}

TEST(masked, mask_dtypes_are_interchangeable_and_masked_nan_is_ignored) {
  auto x = data();
  x.index_put_({0, 3}, std::numeric_limits<float>::quiet_NaN());
  x.index_put_({1, 3}, std::numeric_limits<float>::infinity());
  for (auto m : {mask(), mask().to(torch::kBool), mask().to(torch::kLong)}) {
    expect_close(value_of(masked_mean(x, m)), {4.2}, 1e-6);
    expect_close(value_of(masked_var(x, m)), {6.7}, 1e-5);
  }
}

TEST(masked, empty_mask_gives_zero) {
  auto none = torch::zeros({2, 4});
  expect_close(value_of(masked_mean(data(), none)), {0.0}, 0);
  expect_close(value_of(masked_var(data(), none)), {0.0}, 0);
  auto one = torch::zeros({2, 4});
  one.index_put_({1, 1}, 1);
  expect_close(value_of(masked_var(data(), one)), {0.0}, 0);
  expect_close(value_of(masked_var(data(), one, false)), {0.0}, 0);
}

TEST(masked, whiten_hand_computed) {
  double sd = std::sqrt(6.7 + 1e-8);
  auto w = value_of(masked_whiten(data(), mask()));
  expect_close(
      w, {(1 - 4.2) / sd, (2 - 4.2) / sd, 0, 0, (5 - 4.2) / sd, (6 - 4.2) / sd, (7 - 4.2) / sd, 0},
      1e-5);
  auto kept = value_of(masked_whiten(data(), mask(), {.shift_mean = false}));
  expect_close(kept,
               {(1 - 4.2) / sd + 4.2, (2 - 4.2) / sd + 4.2, 0, 0, (5 - 4.2) / sd + 4.2,
                (6 - 4.2) / sd + 4.2, (7 - 4.2) / sd + 4.2, 0},
               1e-5);
  // Whitened valid entries have mean 0 and unbiased variance 1.
  expect_close(value_of(masked_mean(w, mask())), {0.0}, 1e-6);
  expect_close(value_of(masked_var(w, mask())), {1.0}, 1e-5);
}

TEST(masked, mean_is_differentiable) {
  auto x = data().requires_grad_(true);
  value_of(masked_mean(x, mask())).backward();
  expect_close(x.grad(), {0.2, 0.2, 0, 0, 0.2, 0.2, 0.2, 0}, 1e-7);
}

TEST(loss_agg_mode, parse_and_print) {
  EXPECT_EQ(value_of(parse_loss_agg_mode("token-mean")), loss_agg_mode::token_mean);
  EXPECT_EQ(value_of(parse_loss_agg_mode("seq-mean-token-sum")), loss_agg_mode::seq_mean_token_sum);
  EXPECT_EQ(value_of(parse_loss_agg_mode("seq-mean-token-mean")),
            loss_agg_mode::seq_mean_token_mean);
  EXPECT_EQ(value_of(parse_loss_agg_mode("token-sum")), loss_agg_mode::token_sum);
  EXPECT_EQ(value_of(parse_loss_agg_mode("seq-mean-token-sum-norm")),
            loss_agg_mode::seq_mean_token_sum_norm);
  for (auto mode : {loss_agg_mode::token_mean, loss_agg_mode::seq_mean_token_sum,
                    loss_agg_mode::seq_mean_token_mean, loss_agg_mode::token_sum,
                    loss_agg_mode::seq_mean_token_sum_norm})
    EXPECT_EQ(value_of(parse_loss_agg_mode(to_string(mode))), mode);
  expect_error(parse_loss_agg_mode("token_mean"), errc::invalid_argument,
               "expected one of \"token-mean\", \"seq-mean-token-sum\", \"seq-mean-token-mean\", "
               "\"token-sum\", \"seq-mean-token-sum-norm\", got \"token_mean\"");
}

TEST(aggregate_loss, modes_hand_computed) {
  expect_close(value_of(aggregate_loss(data(), mask(), loss_agg_mode::token_mean)), {4.2}, 1e-6);
  expect_close(value_of(aggregate_loss(data(), mask(), loss_agg_mode::seq_mean_token_sum)),
               {(3.0 + 18.0) / 2}, 1e-6);
  expect_close(value_of(aggregate_loss(data(), mask(), loss_agg_mode::seq_mean_token_mean)),
               {(1.5 + 6.0) / 2}, 1e-6);
  // A row without valid tokens does not count as a sequence.
  auto loss = mat({{1, 2}, {3, 4}, {9, 9}});
  auto m = mat({{1, 1}, {1, 0}, {0, 0}});
  expect_close(value_of(aggregate_loss(loss, m, loss_agg_mode::token_mean)), {2.0}, 1e-6);
  expect_close(value_of(aggregate_loss(loss, m, loss_agg_mode::seq_mean_token_sum)), {3.0}, 1e-6);
  expect_close(value_of(aggregate_loss(loss, m, loss_agg_mode::seq_mean_token_mean)), {2.25}, 1e-6);
  auto none = torch::zeros({3, 2});
  for (auto mode : {loss_agg_mode::token_mean, loss_agg_mode::seq_mean_token_sum,
                    loss_agg_mode::seq_mean_token_mean, loss_agg_mode::token_sum,
                    loss_agg_mode::seq_mean_token_sum_norm})
    expect_close(value_of(aggregate_loss(loss, none, mode)), {0.0}, 0);
}

// The additive modes: the valid tokens' sum [1 + 2 + 3 = 6], unnormalised or
// divided by the scale factor (default: the mask's 2 columns, as verl).
TEST(aggregate_loss, token_sum_and_seq_mean_token_sum_norm) {
  auto loss = mat({{1, 2}, {3, 4}, {9, 9}});
  auto m = mat({{1, 1}, {1, 0}, {0, 0}});
  expect_close(value_of(aggregate_loss(loss, m, loss_agg_mode::token_sum)), {6.0}, 1e-6);
  expect_close(value_of(aggregate_loss(loss, m, loss_agg_mode::seq_mean_token_sum_norm)), {3.0},
               1e-6);
  expect_close(value_of(aggregate_loss(loss, m, loss_agg_mode::seq_mean_token_sum_norm, 12)), {0.5},
               1e-6);
  // The factor is a constant: a part's loss adds up to the whole's.
  auto a = value_of(aggregate_loss(loss.slice(0, 0, 1), m.slice(0, 0, 1),
                                   loss_agg_mode::seq_mean_token_sum_norm, 2));
  auto b = value_of(aggregate_loss(loss.slice(0, 1, 3), m.slice(0, 1, 3),
                                   loss_agg_mode::seq_mean_token_sum_norm, 2));
  expect_close(a + b, {3.0}, 1e-6);
  EXPECT_TRUE(additive(loss_agg_mode::token_sum));
  EXPECT_TRUE(additive(loss_agg_mode::seq_mean_token_sum_norm));
  EXPECT_FALSE(additive(loss_agg_mode::seq_mean_token_sum));
  // Each valid token's gradient is 1 / factor.
  auto x = loss.clone().requires_grad_(true);
  value_of(aggregate_loss(x, m, loss_agg_mode::seq_mean_token_sum_norm, 4)).backward();
  expect_close(x.grad(), {0.25, 0.25, 0.25, 0, 0, 0}, 1e-7);
  expect_error(aggregate_loss(loss, m, loss_agg_mode::token_sum, -1), errc::invalid_argument,
               "scale_factor");
}

TEST(masked, rejects_bad_arguments) {
  expect_error(masked_mean(data(), torch::ones({2, 3})), errc::shape_mismatch,
               "masked_mean: mask has shape [2, 3], expected [2, 4] like x");
  expect_error(masked_sum(data(), mask(), 2), errc::out_of_range,
               "masked_sum: dim 2 is out of range");
  expect_error(masked_var(torch::ones({2, 4}, torch::kLong), mask()), errc::shape_mismatch,
               "x has dtype Long");
  expect_error(masked_whiten(data(), mask(), {.eps = -1.0}), errc::invalid_argument,
               "masked_whiten: eps must be in [0, 1], got -1");
  expect_error(aggregate_loss(torch::ones({4}), torch::ones({4}), loss_agg_mode::token_mean),
               errc::shape_mismatch, "aggregate_loss: loss has shape [4], expected 2 dimensions");
}
