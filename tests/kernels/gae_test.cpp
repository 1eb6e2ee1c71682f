#include "kernels/gae.hpp"

#include "tests/kernels/test_util.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

using namespace troupe;
using namespace troupe::kernels;
using namespace troupe::kernels::testing;

namespace {

const std::vector<double> seed_rewards{0.1, 0.1, 0.2, 0.1, 0.5, 0.1, 0.3, 0.1, 0.1, 1.0};
const std::vector<double> seed_values{0.8, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.3, 0.2, 0.1};

// Plain scalar reference of NOTE [masked scans], for random comparisons.
at::Tensor reference_gae(const at::Tensor& r, const at::Tensor& v, const at::Tensor& m,
                         double gamma, double lambda) {
  auto rr = r.to(torch::kDouble), vv = v.to(torch::kDouble), mm = m.to(torch::kDouble);
  auto out = torch::zeros_like(rr);
  for (int64_t b = 0; b < r.size(0); ++b) {
    double next = 0, carry = 0;
    for (int64_t t = r.size(1) - 1; t >= 0; --t) {
      if (mm[b][t].item<double>() == 0)
        continue;
      double value = vv[b][t].item<double>();
      carry = rr[b][t].item<double>() + gamma * next - value + gamma * lambda * carry;
      out[b][t] = carry;
      next = value;
    }
  }
  return out;
}

} // namespace

TEST(gae, seed_table_gamma_099) {
  // Seed digest Ch 12, gae_visualizer: rows = steps 0..9, columns = λ.
  const std::vector<double> lambdas{0.0, 0.5, 0.9, 0.95, 1.0};
  const std::vector<std::vector<double>> table{
      {-0.0070, 0.0926, 0.8662, 1.1925, 1.6489}, {0.0930, 0.2012, 0.9801, 1.2754, 1.6726},
      {0.0940, 0.2185, 0.9956, 1.2572, 1.5956},  {-0.0050, 0.2515, 1.0119, 1.2368, 1.5167},
      {0.3960, 0.5182, 1.1413, 1.3204, 1.5371},  {0.0960, 0.2469, 0.8365, 0.9828, 1.1526},
      {0.1970, 0.3049, 0.8310, 0.9430, 1.0673},  {-0.0020, 0.2180, 0.7116, 0.7931, 0.8791},
      {-0.0010, 0.4445, 0.8009, 0.8455, 0.8900}, {0.9000, 0.9000, 0.9000, 0.9000, 0.9000}};
  auto rewards = vec(seed_rewards).unsqueeze(0);
  auto values = vec(seed_values).unsqueeze(0);
  auto mask = torch::ones({1, 10});
  for (size_t j = 0; j < lambdas.size(); ++j) {
    auto out = value_of(gae(rewards, values, mask, 0.99, lambdas[j]));
    std::vector<double> want;
    for (const auto& row : table)
      want.push_back(row[j]);
    expect_close(out.advantages, want, 1e-4, "lambda " + std::to_string(lambdas[j]));
    expect_close(out.returns, out.advantages + values, 1e-6);
  }
}

TEST(gae, seed_three_step_example_with_right_padding) {
  // r = [0.1, 0.2, 1.0], V = [0.5, 0.4, 0.2], γ = 0.99, λ = 0.95 → A = [0.7018, 0.7504, 0.8];
  // row 1 is a longer sequence, padding of row 0 holds garbage that must be ignored.
  auto rewards = mat({{0.1, 0.2, 1.0, 100.0, -7.0}, {0.0, 0.0, 0.0, 0.0, 1.0}});
  auto values = mat({{0.5, 0.4, 0.2, 9.0, 9.0}, {0.0, 0.0, 0.0, 0.0, 0.0}});
  auto mask = mat({{1, 1, 1, 0, 0}, {1, 1, 1, 1, 1}}).to(torch::kBool);
  auto out = value_of(gae(rewards, values, mask, 0.99, 0.95));
  expect_close(out.advantages.select(0, 0), {0.7018, 0.7504, 0.8000, 0, 0}, 1e-4);
  expect_close(out.returns.select(0, 0), {0.7018 + 0.5, 0.7504 + 0.4, 1.0, 0, 0}, 1e-4);
  double d = 0.99 * 0.95;
  expect_close(out.advantages.select(0, 1), {d * d * d * d, d * d * d, d * d, d, 1.0}, 1e-6);
}

TEST(gae, mask_holes_are_skipped) {
  // Valid positions 0, 2, 3 (γ = 0.9, λ = 0.8):
  // t3: δ = 4 − 0.2 = 3.8;              A = 3.8
  // t2: δ = 3 + 0.9·0.2 − 0.3 = 2.88;   A = 2.88 + 0.72·3.8 = 5.616
  // t0: δ = 1 + 0.9·0.3 − 0.5 = 0.77;   A = 0.77 + 0.72·5.616 = 4.81352
  auto rewards = mat({{1, 2, 3, 4}});
  auto values = mat({{0.5, 0.4, 0.3, 0.2}});
  auto mask = mat({{1, 0, 1, 1}});
  auto out = value_of(gae(rewards, values, mask, 0.9, 0.8));
  expect_close(out.advantages, {4.81352, 0.0, 5.616, 3.8}, 1e-5);
  expect_close(out.returns, {5.31352, 0.0, 5.916, 4.0}, 1e-5);
}

TEST(gae, gamma_lambda_one_is_reward_to_go_minus_value) {
  torch::manual_seed(3);
  auto rewards = torch::randn({5, 13});
  auto values = torch::randn({5, 13});
  auto mask = torch::ones({5, 13});
  mask.slice(1, 9, 13).zero_();
  auto out = value_of(gae(rewards, values, mask, 1.0, 1.0));
  auto rtg = value_of(discounted_returns(rewards, mask, 1.0));
  expect_close(out.advantages, (rtg - values) * mask, 1e-5);
  expect_close(out.returns, rtg, 1e-5);
}

TEST(gae, matches_scalar_reference_on_random_batches) {
  torch::manual_seed(4);
  auto rewards = torch::randn({37, 29}, torch::kDouble);
  auto values = torch::randn({37, 29}, torch::kDouble);
  auto mask = torch::rand({37, 29}).gt(0.3);
  auto out = value_of(gae(rewards, values, mask, 0.97, 0.9));
  EXPECT_EQ(out.advantages.scalar_type(), torch::kDouble);
  expect_close(out.advantages, reference_gae(rewards, values, mask, 0.97, 0.9), 1e-12);
}

TEST(gae, half_inputs_compute_in_fp32_and_give_no_gradient) {
  torch::manual_seed(5);
  auto rewards = torch::randn({3, 4}).to(torch::kBFloat16);
  auto values = torch::randn({3, 4}).requires_grad_(true);
  auto out = value_of(gae(rewards, values, torch::ones({3, 4}), 1.0, 0.95));
  EXPECT_EQ(out.advantages.scalar_type(), torch::kFloat);
  EXPECT_FALSE(out.advantages.requires_grad());
  EXPECT_FALSE(out.returns.requires_grad());
}

TEST(discounted_returns, hand_computed_with_hole) {
  // γ = 0.5: G2 = 2, G1 = 0 + 0.5·2 = 1, G0 = 1 + 0.5·1 = 1.5; a masked middle step is skipped.
  expect_close(value_of(discounted_returns(mat({{1, 0, 2}}), mat({{1, 1, 1}}), 0.5)),
               {1.5, 1.0, 2.0}, 1e-6);
  expect_close(value_of(discounted_returns(mat({{1, 5, 2, 3}}), mat({{1, 0, 1, 0}}), 0.5)),
               {2.0, 0.0, 2.0, 0.0}, 1e-6);
}

TEST(gae, rejects_bad_arguments) {
  auto r = torch::zeros({4, 8});
  auto m = torch::ones({4, 8});
  expect_error(gae(r, torch::zeros({4, 7}), m, 0.99, 0.95), errc::shape_mismatch,
               "gae: values has shape [4, 7], expected [4, 8] like rewards");
  expect_error(gae(r, torch::zeros({4, 8}), torch::ones({4, 9}), 0.99, 0.95), errc::shape_mismatch,
               "gae: mask has shape [4, 9], expected [4, 8] like rewards");
  expect_error(gae(torch::zeros({8}), torch::zeros({8}), torch::ones({8}), 0.99, 0.95),
               errc::shape_mismatch, "gae: rewards has shape [8], expected 2 dimensions [B, T]");
  expect_error(gae(r, torch::zeros({4, 8}), m, 1.5, 0.95), errc::invalid_argument,
               "gae: gamma must be in [0, 1], got 1.5");
  expect_error(gae(r, torch::zeros({4, 8}), m, 0.99, -0.1), errc::invalid_argument,
               "gae: lambda must be in [0, 1], got -0.1");
  expect_error(gae(torch::zeros({4, 8}, torch::kLong), torch::zeros({4, 8}), m, 0.99, 0.95),
               errc::shape_mismatch, "gae: rewards has dtype Long");
  expect_error(gae(r, at::Tensor{}, m, 0.99, 0.95), errc::invalid_argument,
               "gae: values is undefined");
  expect_error(discounted_returns(r, m, 2.0), errc::invalid_argument,
               "discounted_returns: gamma must be in [0, 1], got 2");
}
