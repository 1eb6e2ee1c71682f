#pragma once
// Training losses over per-token tensors [B, T] and the token-level reward
// shaping of RLHF. Losses are differentiable in the current-policy inputs
// (log_probs, values, entropy); diagnostics are detached 0-dim tensors.
// ATen ops only: any device.

#include "kernels/kl.hpp"
#include "kernels/masked.hpp"
#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>

#include <optional>

namespace troupe::kernels {

/// Options of ppo_policy_loss.
struct ppo_loss_options {
  /// Lower clip ε: the ratio is floored at 1 − clip_low for A < 0, in [0, 1).
  double clip_low = 0.2;
  /// Upper clip ε: the ratio is capped at 1 + clip_high for A > 0, >= 0.
  double clip_high = 0.2;
  /// Dual-clip constant c (> 1): for A < 0 the loss is capped at −c·A.
  /// std::nullopt disables dual clipping; values <= 1 are rejected.
  std::optional<double> dual_clip_c = 3.0;
  /// How the per-token loss becomes a scalar.
  loss_agg_mode agg = loss_agg_mode::token_mean;
};

/// PPO policy loss and its diagnostics.
struct policy_loss_result {
  /// Scalar loss to minimise.
  at::Tensor loss;
  /// Fraction of valid tokens where the clipped term was the larger (chosen) loss.
  at::Tensor pg_clipfrac;
  /// Fraction of valid tokens where the dual clip (−c·A, A < 0) was chosen.
  at::Tensor pg_clipfrac_lower;
  /// Masked mean of old − new log-prob (approximate KL to the behaviour policy).
  at::Tensor ppo_kl;
};

/// Clipped PPO loss: per token −A·r vs −A·clip(r, 1 − ε_low, 1 + ε_high), the larger,
/// then for A < 0 the smaller of that and −c·A; r = exp(clamp(logp − old, ±20)).
/// log_probs, old_log_probs, advantages, mask [B, T].
expected<policy_loss_result> ppo_policy_loss(const at::Tensor& log_probs,
                                             const at::Tensor& old_log_probs,
                                             const at::Tensor& advantages, const at::Tensor& mask,
                                             const ppo_loss_options& opts = {});

/// Options of value_loss.
struct value_loss_options {
  /// Values are clipped to old_values ± clip (> 0); std::nullopt disables clipping.
  std::optional<double> clip = 0.2;
  /// How the per-token loss becomes a scalar.
  loss_agg_mode agg = loss_agg_mode::token_mean;
};

/// Clipped value loss and its diagnostic.
struct value_loss_result {
  /// Scalar loss to minimise: 0.5·agg(max((v − R)², (clip(v, v_old ± ε) − R)²)).
  at::Tensor loss;
  /// Fraction of valid tokens where the clipped term was the larger.
  at::Tensor vf_clipfrac;
};

/// values (current critic), old_values (at rollout), returns, mask [B, T] → clipped value loss.
expected<value_loss_result> value_loss(const at::Tensor& values, const at::Tensor& old_values,
                                       const at::Tensor& returns, const at::Tensor& mask,
                                       const value_loss_options& opts = {});

/// Aggregated entropy [B, T] → scalar, to be SUBTRACTED from the loss times its coefficient.
expected<at::Tensor> entropy_bonus(const at::Tensor& entropy, const at::Tensor& mask,
                                   loss_agg_mode agg = loss_agg_mode::token_mean);

/// KL loss: the estimator of kl_penalty per token [B, T], aggregated to a scalar.
expected<at::Tensor> kl_loss(const at::Tensor& log_probs, const at::Tensor& ref_log_probs,
                             const at::Tensor& mask, kl_estimator est = kl_estimator::k3,
                             loss_agg_mode agg = loss_agg_mode::token_mean);

/// Shaped token rewards and the per-token KL they were built from.
struct token_rewards_result {
  /// [B, T]: −β·kl per valid token, plus the score at the row's last valid token.
  at::Tensor rewards;
  /// [B, T]: the per-token KL estimate, 0 outside the mask.
  at::Tensor kl;
};

/// scores [B], log_probs / ref_log_probs / mask [B, T], β >= 0 → token-level rewards
/// (RM score on the last valid token, −β·KL on every valid token). Constants (no gradient).
expected<token_rewards_result> token_level_rewards(const at::Tensor& scores,
                                                   const at::Tensor& log_probs,
                                                   const at::Tensor& ref_log_probs,
                                                   const at::Tensor& mask, double beta,
                                                   kl_estimator est = kl_estimator::k1);

} // namespace troupe::kernels
