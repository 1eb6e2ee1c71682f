#pragma once
// Training losses over per-token tensors [B, T] and the token-level reward
// shaping of RLHF. Losses are differentiable in the current-policy inputs
// (log_probs, values, entropy); diagnostics are detached 0-dim tensors.
// ATen ops only: any device.

#include "kernels/kl.hpp"
#include "kernels/masked.hpp"
#include "runtime/enum_names.hpp"
#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>

#include <optional>

namespace troupe::kernels {

/// The policy losses an actor update chooses from (rl.policy_loss).
enum class policy_loss_kind : uint8_t {
  /// Clipped token ratio (Schulman et al. 2017), dual clip (Ye et al. 2020),
  /// asymmetric ε (DAPO's clip-higher).
  ppo,
  /// Group Sequence Policy Optimization (Zheng et al. 2025): the clipped,
  /// length-normalised sequence ratio.
  gspo,
  /// Clipped IS-weight Policy Optimization (MiniMax-M1, 2025): clipped,
  /// stop-gradient importance weights times the log-prob.
  cispo,
};
TROUPE_ENUM_NAMES(policy_loss_kind, "ppo", "gspo", "cispo")

/// The clip parameters and the aggregation of a policy loss.
struct policy_loss_options {
  /// Lower clip ε: the ratio is floored at 1 − clip_low, in [0, 1) (cispo:
  /// any >= 0; 1 or more leaves the weight without a floor, as the paper).
  double clip_low = 0.2;
  /// Upper clip ε: the ratio is capped at 1 + clip_high, >= 0.
  double clip_high = 0.2;
  /// ppo's dual-clip constant c (> 1): for A < 0 the loss is capped at −c·A.
  /// std::nullopt disables dual clipping; values <= 1 are rejected.
  std::optional<double> dual_clip_c = 3.0;
  /// How the per-token loss becomes a scalar (gspo: always seq-mean-token-mean).
  loss_agg_mode agg = loss_agg_mode::token_mean;
  /// seq-mean-token-sum-norm's divisor; 0 = the mask's column count.
  double loss_scale_factor = 0;
};

/// A policy loss and its diagnostics.
struct policy_loss_result {
  /// Scalar loss to minimise.
  at::Tensor loss;
  /// Fraction of valid tokens where the clip acted: ppo / gspo, the clipped
  /// term was the larger (chosen) loss; cispo, the weight was clipped.
  at::Tensor pg_clipfrac;
  /// Fraction of valid tokens where the dual clip (−c·A, A < 0) was chosen (ppo).
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
                                             const policy_loss_options& opts = {});

/// GSPO: the sequence ratio s_i = exp(mean over y_i's tokens of (logp − old))
/// in the paper's token form s_i,t = sg(s_i)·π(y_t)/sg(π(y_t)) (its value s_i
/// on every token, its gradient s_i·∇log π(y_t)), clipped as ppo's ratio
/// without dual clip (log s_i,t capped at 10), aggregated seq-mean-token-mean:
/// the loss is mean_i −A_i·clip(s_i), each token's gradient divided by |y_i|.
/// Advantages are per sequence (the same on a row's valid tokens).
expected<policy_loss_result> gspo_policy_loss(const at::Tensor& log_probs,
                                              const at::Tensor& old_log_probs,
                                              const at::Tensor& advantages, const at::Tensor& mask,
                                              const policy_loss_options& opts = {});

/// CISPO: per token −sg(clip(r, 1 − ε_low, 1 + ε_high))·A·logp, r =
/// exp(clamp(logp − old, ±20)): every token keeps a gradient, its IS weight
/// clipped (ppo drops the gradient of clipped tokens instead).
expected<policy_loss_result> cispo_policy_loss(const at::Tensor& log_probs,
                                               const at::Tensor& old_log_probs,
                                               const at::Tensor& advantages, const at::Tensor& mask,
                                               const policy_loss_options& opts = {});

/// NOTE [policy loss spec]: what an actor update minimises, as one value
/// the driver sends with every update (the engine has one verb for every
/// algorithm): the policy loss with its clips and aggregation, minus
/// entropy_coef · the entropy bonus, plus kl_coef · the KL loss, each term
/// aggregated the same way (effective_agg), so a batch split into parts —
/// micro-batches, DP ranks — weights every term alike (NOTE [micro-batches]
/// in actors/train/train_engine.cpp).
struct policy_loss_spec {
  policy_loss_kind kind = policy_loss_kind::ppo;
  policy_loss_options options;
  double entropy_coef = 0;
  /// KL-to-reference loss coefficient (0 = no KL loss).
  double kl_coef = 0;
  kl_estimator kl = kl_estimator::k3;
};

/// The aggregation every term of `spec` uses: gspo's seq-mean-token-mean, else options.agg.
loss_agg_mode effective_agg(const policy_loss_spec& spec);

/// The per-token tensors an actor loss reads, [B, T]; entropy and
/// ref_log_probs may be undefined (no entropy bonus; no KL loss).
struct actor_loss_inputs {
  at::Tensor log_probs, old_log_probs, advantages, mask, entropy, ref_log_probs;
};

/// An actor loss and its parts.
struct actor_loss_result {
  /// pg.loss − entropy_coef·entropy + kl_coef·kl_loss.
  at::Tensor loss;
  policy_loss_result pg;
  /// The aggregated entropy (undefined without inputs.entropy).
  at::Tensor entropy;
  /// The aggregated KL loss (undefined when kl_coef is 0).
  at::Tensor kl_loss;
};

/// The loss of `spec` over `in` (NOTE [policy loss spec]).
expected<actor_loss_result> actor_loss(const actor_loss_inputs& in, const policy_loss_spec& spec);

/// Options of value_loss.
struct value_loss_options {
  /// Values are clipped to old_values ± clip (> 0); std::nullopt disables clipping.
  std::optional<double> clip = 0.2;
  /// How the per-token loss becomes a scalar.
  loss_agg_mode agg = loss_agg_mode::token_mean;
  /// seq-mean-token-sum-norm's divisor; 0 = the mask's column count.
  double loss_scale_factor = 0;
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

/// Aggregated entropy [B, T] → scalar, to be SUBTRACTED from the loss times its
/// coefficient (scale_factor as aggregate_loss's).
expected<at::Tensor> entropy_bonus(const at::Tensor& entropy, const at::Tensor& mask,
                                   loss_agg_mode agg = loss_agg_mode::token_mean,
                                   double scale_factor = 0);

/// KL loss: the estimator of kl_penalty per token [B, T], aggregated to a scalar.
expected<at::Tensor> kl_loss(const at::Tensor& log_probs, const at::Tensor& ref_log_probs,
                             const at::Tensor& mask, kl_estimator est = kl_estimator::k3,
                             loss_agg_mode agg = loss_agg_mode::token_mean,
                             double scale_factor = 0);

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
