#pragma once
// Critic-free advantage estimators. Outcome estimators take one scalar score
// per sequence [B] and broadcast the advantage over the valid tokens of the
// response mask [B, T] (0 elsewhere). Groups are given as integer ids [B]
// (samples of the same prompt share an id; any values, any order); use
// contiguous_group_ids for the common "n consecutive samples per prompt".
// Results are constants (no gradient) in fp32 (fp64 if an input is fp64);
// ATen ops only, so any device.

#include "kernels/gae.hpp"
#include "runtime/enum_names.hpp"
#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>

#include <string_view>

namespace troupe::kernels {

/// Group ids [batch] (int64) 0,0,…,1,1,… for `group_size` consecutive samples per group.
expected<at::Tensor> contiguous_group_ids(int64_t batch, int64_t group_size,
                                          at::Device device = at::kCPU);

/// Options of grpo_advantages.
struct grpo_options {
  /// Divide by the group's (unbiased) standard deviation; false gives Dr. GRPO.
  bool norm_by_std = true;
  /// Added to the standard deviation.
  double eps = 1e-6;
};

/// GRPO: (score − group mean) / (group std + eps), broadcast over the mask.
/// NOTE [groups of one]: a sample alone in its group has no baseline; as
/// verl, its group counts as mean 0, std 1, so its advantage is its raw
/// score (/(1 + eps) with the std); the driver warns, naming the prompt
/// (singleton_groups finds them). returns = advantages.
expected<advantage_result> grpo_advantages(const at::Tensor& scores, const at::Tensor& mask,
                                           const at::Tensor& group_ids,
                                           const grpo_options& opts = {});

/// RLOO: score − mean of the OTHER scores of its group, broadcast; a sample
/// alone in its group keeps its raw score (NOTE [groups of one]).
/// returns = advantages.
expected<advantage_result> rloo_advantages(const at::Tensor& scores, const at::Tensor& mask,
                                           const at::Tensor& group_ids);

/// REINFORCE++: token rewards [B, T] → discounted returns (γ) → whitened over all
/// valid tokens of the batch. returns = the unwhitened discounted returns.
expected<advantage_result> reinforce_pp_advantages(const at::Tensor& token_rewards,
                                                   const at::Tensor& mask, double gamma);

/// REINFORCE++-baseline: score − group mean (0 for a sample alone in its group),
/// broadcast, then whitened over all valid tokens of the batch. returns = advantages.
expected<advantage_result> reinforce_pp_baseline_advantages(const at::Tensor& scores,
                                                            const at::Tensor& mask,
                                                            const at::Tensor& group_ids);

/// ReMax (Li et al. 2023): the reward-to-go of the token rewards [B, T]
/// (undiscounted; dense per-token scores and a KL penalty count where they
/// fall) minus baseline_scores [B] — the score of the greedy response to the
/// same prompt — on every valid token. returns = the reward-to-go.
expected<advantage_result> remax_advantages(const at::Tensor& token_rewards,
                                            const at::Tensor& baseline_scores,
                                            const at::Tensor& mask);

/// Indices (int64 [K], ascending) of the samples alone in their group.
expected<at::Tensor> singleton_groups(const at::Tensor& group_ids);

/// The advantage estimators a job chooses from (rl.advantage).
enum class advantage_estimator : uint8_t {
  gae,
  grpo,
  rloo,
  reinforce_pp,
  reinforce_pp_baseline,
  remax
};
TROUPE_ENUM_NAMES(advantage_estimator, "gae", "grpo", "rloo", "reinforce_pp",
                  "reinforce_pp_baseline", "remax")

/// Parses the names above.
expected<advantage_estimator> parse_advantage_estimator(std::string_view name);

/// What the estimators read: scores [B], token rewards [B, T] (score at the
/// last token, KL penalty per token), values [B, T] (gae only), the response
/// mask [B, T], group ids [B] and, for remax, the greedy baseline's scores [B].
struct advantage_inputs {
  at::Tensor scores, token_rewards, values, mask, group_ids, baseline_scores;
  /// grpo: divide by the group's std (false: Dr. GRPO).
  bool norm_by_std = true;
  double gamma = 1.0;
  double lam = 0.95;
  /// gae: whiten the advantages over the batch's response tokens (returns stay raw).
  bool whiten = true;
};

/// Advantages and returns of `in` by estimator `e`.
expected<advantage_result> estimate_advantages(advantage_estimator e, const advantage_inputs& in);

/// Truncated importance sampling of stale samples: w = min(exp(lp_policy −
/// lp_behaviour), cap) · mask [B, T], and the fraction of valid tokens capped.
struct importance_weights {
  at::Tensor weights;
  double capped_fraction = 0;
};
expected<importance_weights> truncated_importance_weights(const at::Tensor& policy_log_probs,
                                                          const at::Tensor& behaviour_log_probs,
                                                          const at::Tensor& mask, double cap);

} // namespace troupe::kernels
