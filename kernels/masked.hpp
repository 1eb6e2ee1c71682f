#pragma once
// Masked statistics over token tensors and the loss aggregation modes.
// Masks are bool or numeric tensors of the data's shape; nonzero = valid.
// Every function here is built from ATen ops: any device, differentiable in
// `x` (the mask is a constant).

#include "runtime/enum_names.hpp"
#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string_view>

namespace troupe::kernels {

/// How a per-token loss [B, T] becomes a scalar.
enum class loss_agg_mode : uint8_t {
  /// Sum over all valid tokens / number of valid tokens ("token-mean").
  token_mean,
  /// Per-sequence sum over valid tokens, then mean over sequences that have at
  /// least one valid token ("seq-mean-token-sum").
  seq_mean_token_sum,
  /// Per-sequence mean over valid tokens, then mean over sequences that have
  /// at least one valid token ("seq-mean-token-mean").
  seq_mean_token_mean,
  /// Sum over all valid tokens, unnormalised ("token-sum").
  token_sum,
  /// Sum over all valid tokens divided by a constant, the loss scale factor
  /// (default the mask's column count, as verl; Dr. GRPO's normaliser)
  /// ("seq-mean-token-sum-norm").
  seq_mean_token_sum_norm,
};
TROUPE_ENUM_NAMES(loss_agg_mode, "token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                  "token-sum", "seq-mean-token-sum-norm")

/// NOTE [additive aggregation]: token-sum and seq-mean-token-sum-norm are
/// sums over tokens divided by a constant, so a batch's loss is the plain
/// sum of its parts' losses (the constant fixed for the whole batch); the
/// mean modes normalise by what a part holds (tokens or sequences), so
/// parts are weighted by their share of those units.
inline bool additive(loss_agg_mode m) {
  return m == loss_agg_mode::token_sum || m == loss_agg_mode::seq_mean_token_sum_norm;
}

/// Parses the names above; errc::invalid_argument listing the valid names otherwise.
expected<loss_agg_mode> parse_loss_agg_mode(std::string_view name);

/// Σ x over valid elements: a scalar, or reduced along `dim` when given.
/// Result dtype is x's; masked-out elements (even NaN/inf) contribute 0.
expected<at::Tensor> masked_sum(const at::Tensor& x, const at::Tensor& mask,
                                std::optional<int64_t> dim = std::nullopt);

/// Mean of x over valid elements (scalar, or along `dim`); 0 where nothing is valid.
expected<at::Tensor> masked_mean(const at::Tensor& x, const at::Tensor& mask,
                                 std::optional<int64_t> dim = std::nullopt);

/// Variance of x over all valid elements (scalar). `unbiased` divides by n − 1
/// (Bessel); the result is 0 when fewer than 2 (unbiased) or 1 elements are valid.
expected<at::Tensor> masked_var(const at::Tensor& x, const at::Tensor& mask, bool unbiased = true);

/// Options of masked_whiten.
struct whiten_options {
  /// Subtract the mean; when false the mean is added back after scaling
  /// (verl's convention: only the spread is normalised).
  bool shift_mean = true;
  /// Added to the variance before the inverse square root.
  double eps = 1e-8;
};

/// (x − mean)·rsqrt(var + eps) over valid elements (unbiased variance), 0 outside the mask.
expected<at::Tensor> masked_whiten(const at::Tensor& x, const at::Tensor& mask,
                                   const whiten_options& opts = {});

/// Aggregates a per-token loss [B, T] over the valid tokens of `mask` [B, T]
/// into a scalar according to `mode`; 0 when no token is valid.
/// `scale_factor` is seq-mean-token-sum-norm's divisor (> 0; 0 = the mask's
/// column count T); the other modes ignore it.
expected<at::Tensor> aggregate_loss(const at::Tensor& loss, const at::Tensor& mask,
                                    loss_agg_mode mode, double scale_factor = 0);

} // namespace troupe::kernels
