#pragma once
// Offline preference optimisation: the DPO family's losses over the
// sequence log-probs of preference pairs. ATen ops only: any device.

#include "runtime/enum_names.hpp"
#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace troupe::kernels {

/// A sequence's log-prob from its tokens' [B, T] over the valid tokens of
/// `mask`: their sum, or with `average` their mean (0 for a row with none).
/// Differentiable in `token_log_probs`.
expected<at::Tensor> sequence_log_probs(const at::Tensor& token_log_probs, const at::Tensor& mask,
                                        bool average = false);

/// The DPO losses (TRL's names for dpo.loss_type).
enum class dpo_loss_kind : uint8_t {
  /// −log σ(β·h) (Rafailov et al. 2023), label-smoothed as cDPO: −(1 − ε)·log
  /// σ(β·h) − ε·log σ(−β·h).
  sigmoid,
  /// max(0, 1 − β·h) (SLiC, Zhao et al. 2023).
  hinge,
  /// (h − 1/(2β))² (IPO, Azar et al. 2023), on length-averaged log-probs.
  ipo,
};
TROUPE_ENUM_NAMES(dpo_loss_kind, "sigmoid", "hinge", "ipo")

/// Whether `loss` reads length-averaged sequence log-probs (IPO, as TRL).
inline bool length_averaged(dpo_loss_kind loss) {
  return loss == dpo_loss_kind::ipo;
}

/// Options of dpo_loss.
struct dpo_options {
  /// β > 0: the strength of the implicit KL to the reference.
  double beta = 0.1;
  dpo_loss_kind loss = dpo_loss_kind::sigmoid;
  /// ε in [0, 0.5): the probability that a pair's label is flipped (sigmoid only).
  double label_smoothing = 0;
};

/// A DPO loss and its diagnostics.
struct dpo_result {
  /// The mean over pairs, to minimise.
  at::Tensor loss;
  /// β·(log π(y_w) − log π_ref(y_w)) and β·(log π(y_l) − log π_ref(y_l)), [B], detached.
  at::Tensor chosen_rewards, rejected_rewards;
};

/// h = (log π(y_w) − log π(y_l)) − (log π_ref(y_w) − log π_ref(y_l)) for each
/// pair from the sequence log-probs [B] of the policy (differentiable) and
/// the reference (constants), then the loss of `opts`. IPO expects
/// length-averaged log-probs (sequence_log_probs with average).
expected<dpo_result> dpo_loss(const at::Tensor& chosen_log_probs,
                              const at::Tensor& rejected_log_probs,
                              const at::Tensor& ref_chosen_log_probs,
                              const at::Tensor& ref_rejected_log_probs,
                              const dpo_options& opts = {});

} // namespace troupe::kernels
