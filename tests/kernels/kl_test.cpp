#include "kernels/kl.hpp"

#include "tests/kernels/test_util.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

using namespace troupe;
using namespace troupe::kernels;
using namespace troupe::kernels::testing;

TEST(kl_estimator, parse_names_and_aliases) {
  EXPECT_EQ(value_of(parse_kl_estimator("k1")), kl_estimator::k1);
  EXPECT_EQ(value_of(parse_kl_estimator("kl")), kl_estimator::k1);
  EXPECT_EQ(value_of(parse_kl_estimator("abs")), kl_estimator::abs);
  EXPECT_EQ(value_of(parse_kl_estimator("k2")), kl_estimator::k2);
  EXPECT_EQ(value_of(parse_kl_estimator("mse")), kl_estimator::k2);
  EXPECT_EQ(value_of(parse_kl_estimator("k3")), kl_estimator::k3);
  EXPECT_EQ(value_of(parse_kl_estimator("low_var_kl")), kl_estimator::k3);
  EXPECT_EQ(value_of(parse_kl_estimator("k1+")), kl_estimator::k1_st);
  EXPECT_EQ(value_of(parse_kl_estimator("k3+")), kl_estimator::k3_st);
  EXPECT_EQ(value_of(parse_kl_estimator("low_var_kl+")), kl_estimator::k3_st);
  for (auto est : {kl_estimator::k1, kl_estimator::abs, kl_estimator::k2, kl_estimator::k3,
                   kl_estimator::k1_st, kl_estimator::k3_st})
    EXPECT_EQ(value_of(parse_kl_estimator(to_string(est))), est);
  expect_error(parse_kl_estimator("k4"), errc::invalid_argument,
               "expected one of \"k1\", \"abs\", \"k2\", \"k3\", \"k1+\", \"k3+\" (aliases "
               "\"kl\", \"mse\", \"low_var_kl\", \"kl+\", \"low_var_kl+\"), got \"k4\"");
}

TEST(kl_penalty, estimators_hand_computed) {
  // x = logp − ref = [0.2, 0, −0.3].
  auto logp = vec({-1.0, -0.5, -1.5});
  auto ref = vec({-1.2, -0.5, -1.2});
  expect_close(value_of(kl_penalty(logp, ref, kl_estimator::k1)), {0.2, 0.0, -0.3}, 1e-6);
  expect_close(value_of(kl_penalty(logp, ref, kl_estimator::abs)), {0.2, 0.0, 0.3}, 1e-6);
  expect_close(value_of(kl_penalty(logp, ref, kl_estimator::k2)), {0.02, 0.0, 0.045}, 1e-6);
  expect_close(value_of(kl_penalty(logp, ref, kl_estimator::k3)),
               {std::exp(-0.2) + 0.2 - 1, 0.0, std::exp(0.3) - 0.3 - 1}, 1e-6);
}

TEST(kl_penalty, k3_is_non_negative_and_differentiable) {
  torch::manual_seed(3);
  auto logp = torch::randn({4, 9}, torch::kDouble).requires_grad_(true);
  auto ref = torch::randn({4, 9}, torch::kDouble);
  auto k3 = value_of(kl_penalty(logp, ref, kl_estimator::k3));
  EXPECT_TRUE(k3.ge(0).all().item<bool>());
  k3.sum().backward();
  // d/dlogp [exp(ref − logp) + (logp − ref) − 1] = 1 − exp(ref − logp),
  // 0 where the value clamp at 10 acts (NOTE [k3 clamp]).
  auto x = logp.detach() - ref;
  auto inside = ((-x).exp() + x - 1).le(10);
  EXPECT_FALSE(inside.all().item<bool>()) << "no clamped element: the case is not covered";
  expect_close(logp.grad(), torch::where(inside, 1.0 - (-x).exp(), torch::zeros_like(x)), 1e-12);
  EXPECT_TRUE(k3.le(10).all().item<bool>());
}

// NOTE [k3 clamp]: x = −15 would give e^15 − 16 ≈ 3.3·10⁶; verl's clamps give
// 10 (no gradient there). x = 25 is clamped to 20 first: e^−20 + 19 → 10 too.
TEST(kl_penalty, k3_is_clamped_as_verl) {
  auto logp = vec({-16.0, -1.0, 24.0}, at::kDouble).requires_grad_(true);
  auto ref = vec({-1.0, -1.5, -1.0}, at::kDouble);
  auto k3 = value_of(kl_penalty(logp, ref, kl_estimator::k3));
  expect_close(k3, {10.0, std::exp(-0.5) + 0.5 - 1, 10.0}, 1e-12);
  k3.sum().backward();
  expect_close(logp.grad(), {0.0, 1 - std::exp(-0.5), 0.0}, 1e-12);
  // Unclamped, the first would have been e^15 − 16.
  EXPECT_GT(std::exp(15.0) - 16, 3.2e6);
}

// k1+ and k3+: the value of k1 / k3 (clamped), the gradient of k2 (x).
TEST(kl_penalty, straight_through_variants) {
  for (auto [est, want] :
       {std::pair{kl_estimator::k1_st, std::vector<double>{-15, 0.5}},
        std::pair{kl_estimator::k3_st, std::vector<double>{10, std::exp(-0.5) + 0.5 - 1}}}) {
    SCOPED_TRACE(std::string{to_string(est)});
    auto logp = vec({-16.0, -1.0}, at::kDouble).requires_grad_(true);
    auto ref = vec({-1.0, -1.5}, at::kDouble);
    auto kl = value_of(kl_penalty(logp, ref, est));
    expect_close(kl, want, 1e-12);
    kl.sum().backward();
    expect_close(logp.grad(), {-15.0, 0.5}, 1e-12);
  }
}

TEST(kl_penalty, rejects_bad_arguments) {
  expect_error(kl_penalty(torch::zeros({2, 3}), torch::zeros({2, 4}), kl_estimator::k1),
               errc::shape_mismatch,
               "kl_penalty: ref_log_probs has shape [2, 4], expected [2, 3] like log_probs");
  expect_error(kl_penalty(torch::zeros({2}, torch::kInt), torch::zeros({2}), kl_estimator::k1),
               errc::shape_mismatch, "log_probs has dtype Int");
}
