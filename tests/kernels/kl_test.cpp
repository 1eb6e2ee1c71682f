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
  for (auto est : {kl_estimator::k1, kl_estimator::abs, kl_estimator::k2, kl_estimator::k3})
    EXPECT_EQ(value_of(parse_kl_estimator(to_string(est))), est);
  expect_error(parse_kl_estimator("k4"), errc::invalid_argument,
               "expected one of \"k1\", \"abs\", \"k2\", \"k3\" (aliases \"kl\", \"mse\", "
               "\"low_var_kl\"), got \"k4\"");
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
  // d/dlogp [exp(ref − logp) + (logp − ref) − 1] = 1 − exp(ref − logp).
  expect_close(logp.grad(), 1.0 - (ref - logp.detach()).exp(), 1e-12);
}

TEST(kl_penalty, rejects_bad_arguments) {
  expect_error(kl_penalty(torch::zeros({2, 3}), torch::zeros({2, 4}), kl_estimator::k1),
               errc::shape_mismatch,
               "kl_penalty: ref_log_probs has shape [2, 4], expected [2, 3] like log_probs");
  expect_error(kl_penalty(torch::zeros({2}, torch::kInt), torch::zeros({2}), kl_estimator::k1),
               errc::shape_mismatch, "log_probs has dtype Int");
}
