#pragma once
// Per-token KL estimators between the policy and the reference, from the
// log-probs of the sampled tokens. With x = log π(a) − log π_ref(a):
//   k1  = x                      unbiased, can be negative   ("kl")
//   abs = |x|
//   k2  = ½·x²                                              ("mse")
//   k3  = exp(−x) + x − 1        unbiased, ≥ 0, low variance ("low_var_kl")
//   k1+, k3+                     straight-through: the value of k1 / k3, the
//                                gradient of k2 (x), for the KL loss
// NOTE [k3 clamp]: k3 grows as exp(−x) — a log-ratio of −15 gives 3.3·10⁶,
// one token enough to blow up a step — so, as verl does, x is clamped to
// [−20, 20] before the exponential and k3's value to [−10, 10] (where the
// clamp acts, k3 passes no gradient; k3+ still passes k2's).
// The exact KL over the vocabulary is exact_kl_from_logits (logprobs.hpp).

#include "runtime/enum_names.hpp"
#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string_view>

namespace troupe::kernels {

/// Which per-token KL estimator to use (see the table above).
enum class kl_estimator : uint8_t { k1, abs, k2, k3, k1_st, k3_st };
TROUPE_ENUM_NAMES(kl_estimator, "k1", "abs", "k2", "k3", "k1+", "k3+")
TROUPE_ENUM_ALIASES(kl_estimator, {"kl", kl_estimator::k1}, {"mse", kl_estimator::k2},
                    {"low_var_kl", kl_estimator::k3}, {"kl+", kl_estimator::k1_st},
                    {"low_var_kl+", kl_estimator::k3_st})

/// Parses "k1", "abs", "k2", "k3", "k1+", "k3+" and the aliases "kl" (k1),
/// "mse" (k2), "low_var_kl" (k3), "kl+", "low_var_kl+"; errc::invalid_argument
/// listing the valid names otherwise.
expected<kl_estimator> parse_kl_estimator(std::string_view name);

/// log_probs, ref_log_probs [...] (same shape, floating) → per-token estimate
/// [...] in their promoted dtype; unmasked, differentiable in both.
expected<at::Tensor> kl_penalty(const at::Tensor& log_probs, const at::Tensor& ref_log_probs,
                                kl_estimator est);

/// The adaptive KL controller (Ziegler et al. 2019): after a batch of
/// `samples` sequences with mean sequence KL `kl`,
///   β ← β · (1 + clamp(kl / target − 1, −0.2, 0.2) · samples / horizon).
double adaptive_kl_coef(double beta, double kl, double target, int64_t samples, int64_t horizon);

} // namespace troupe::kernels
