#include "kernels/preference.hpp"

#include "tests/kernels/test_util.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

using namespace troupe;
using namespace troupe::kernels;
using namespace troupe::kernels::testing;

namespace {

double softplus(double x) {
  return std::log1p(std::exp(x));
}
double sigmoid(double x) {
  return 1 / (1 + std::exp(-x));
}

// Two pairs at β = 0.5: h = (π_w − π_l) − (ref_w − ref_l) = [1.5, −1.5].
struct pairs_case {
  at::Tensor chosen = vec({-1, -2}, at::kDouble);
  at::Tensor rejected = vec({-3, -1}, at::kDouble);
  at::Tensor ref_chosen = vec({-1.5, -1.5}, at::kDouble);
  at::Tensor ref_rejected = vec({-2, -2}, at::kDouble);

  // The loss and its gradients with respect to the policy's log-probs.
  std::tuple<dpo_result, at::Tensor, at::Tensor> run(const dpo_options& o) const {
    auto c = chosen.clone().requires_grad_(true);
    auto r = rejected.clone().requires_grad_(true);
    auto out = value_of(dpo_loss(c, r, ref_chosen, ref_rejected, o));
    out.loss.backward();
    return {out, c.grad(), r.grad()};
  }
};

} // namespace

TEST(sequence_log_probs, sum_or_mean_of_the_valid_tokens) {
  auto lp = mat({{-1, -2, 9}, {-3, 9, 9}, {9, 9, 9}});
  auto mask = mat({{1, 1, 0}, {1, 0, 0}, {0, 0, 0}});
  expect_close(value_of(sequence_log_probs(lp, mask)), {-3, -3, 0}, 1e-6);
  expect_close(value_of(sequence_log_probs(lp, mask, true)), {-1.5, -3, 0}, 1e-6);
  expect_error(sequence_log_probs(vec({1, 2}), vec({1, 1})), errc::shape_mismatch,
               "sequence_log_probs: token_log_probs has shape [2], expected 2 dimensions");
}

// DPO: −log σ(β·h) = softplus(−β·h), averaged; d/dπ_w = −β·σ(−β·h) / B and
// d/dπ_l its opposite. The implicit rewards are β·(π − ref) of each side.
TEST(dpo_loss, sigmoid_value_gradient_and_rewards) {
  pairs_case c;
  auto [out, gc, gr] = c.run({.beta = 0.5});
  expect_close(out.loss, {(softplus(-0.75) + softplus(0.75)) / 2}, 1e-12);
  expect_close(gc, {-0.5 * sigmoid(-0.75) / 2, -0.5 * sigmoid(0.75) / 2}, 1e-12);
  expect_close(gr, {0.5 * sigmoid(-0.75) / 2, 0.5 * sigmoid(0.75) / 2}, 1e-12);
  expect_close(out.chosen_rewards, {0.25, -0.25}, 1e-12);
  expect_close(out.rejected_rewards, {-0.5, 0.5}, 1e-12);
  EXPECT_FALSE(out.chosen_rewards.requires_grad());
}

// cDPO: −(1 − ε)·log σ(β·h) − ε·log σ(−β·h).
TEST(dpo_loss, label_smoothing) {
  pairs_case c;
  auto [out, gc, gr] = c.run({.beta = 0.5, .label_smoothing = 0.1});
  auto per = [](double x) { return 0.9 * softplus(-x) + 0.1 * softplus(x); };
  expect_close(out.loss, {(per(0.75) + per(-0.75)) / 2}, 1e-12);
  auto grad = [](double x) { return 0.5 * (-0.9 * sigmoid(-x) + 0.1 * sigmoid(x)) / 2; };
  expect_close(gc, {grad(0.75), grad(-0.75)}, 1e-12);
}

// Hinge: max(0, 1 − β·h) = [0.25, 1.75]; both active: d/dπ_w = −β / B.
// IPO: (h − 1/(2β))² = [0.25, 6.25]; d/dπ_w = 2·(h − 1) / B.
TEST(dpo_loss, hinge_and_ipo) {
  pairs_case c;
  auto [hinge, hc, hr] = c.run({.beta = 0.5, .loss = dpo_loss_kind::hinge});
  expect_close(hinge.loss, {1.0}, 1e-12);
  expect_close(hc, {-0.25, -0.25}, 1e-12);
  expect_close(hr, {0.25, 0.25}, 1e-12);
  auto [ipo, ic, ir] = c.run({.beta = 0.5, .loss = dpo_loss_kind::ipo});
  expect_close(ipo.loss, {3.25}, 1e-12);
  expect_close(ic, {0.5, -2.5}, 1e-12);
  expect_close(ir, {-0.5, 2.5}, 1e-12);
  // A hinge past its margin passes no gradient: β·h = 3 > 1.
  auto [past, pc, pr] = c.run({.beta = 2.0, .loss = dpo_loss_kind::hinge});
  expect_close(pc.select(0, 0), {0.0}, 0);
  expect_close(pr.select(0, 0), {0.0}, 0);
}

// The reference's log-probs are constants: no gradient reaches them.
TEST(dpo_loss, the_reference_is_a_constant) {
  pairs_case c;
  auto ref = c.ref_chosen.clone().requires_grad_(true);
  auto out =
      value_of(dpo_loss(c.chosen.clone().requires_grad_(true), c.rejected, ref, c.ref_rejected));
  out.loss.backward();
  EXPECT_FALSE(ref.grad().defined());
}

TEST(dpo_loss, rejects_bad_arguments) {
  pairs_case c;
  expect_error(dpo_loss(c.chosen, vec({1}), c.ref_chosen, c.ref_rejected), errc::shape_mismatch,
               "dpo_loss: rejected_log_probs has shape [1], expected [2] like chosen_log_probs");
  expect_error(dpo_loss(c.chosen, c.rejected, c.ref_chosen, c.ref_rejected, {.beta = 0}),
               errc::invalid_argument, "dpo_loss: beta must be in (0, inf), got 0");
  expect_error(
      dpo_loss(c.chosen, c.rejected, c.ref_chosen, c.ref_rejected, {.label_smoothing = 0.5}),
      errc::invalid_argument, "label_smoothing must be in [0, 0.5)");
  expect_error(dpo_loss(c.chosen, c.rejected, c.ref_chosen, c.ref_rejected,
                        {.loss = dpo_loss_kind::hinge, .label_smoothing = 0.1}),
               errc::invalid_argument,
               "label_smoothing applies to the sigmoid loss only, not hinge");
}
