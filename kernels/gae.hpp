#pragma once
// Generalised advantage estimation and discounted returns over token tensors
// [B, T] with a response mask (right padded, holes allowed).
//
// NOTE [masked scans]
// Scans run backwards over the VALID positions of each row only: a masked
// position is skipped (its output is 0 and it neither breaks nor feeds the
// recursion), so the "next value" of a valid token is the value of the next
// valid token, and the value after the last valid token is 0 (terminal).
//   δ_t = r_t + γ·V_next − V_t,   A_t = δ_t + γλ·A_next,   R_t = A_t + V_t.
//
// Inputs are fp16/bf16/fp32/fp64; the scan runs and returns in fp32 (fp64 if
// any input is fp64). Results are constants (no gradient). CPU runs a tight
// loop parallel over rows; CUDA tensors run kernels/cuda/gae.cu (one thread per
// row) when the build has it, errc::unsupported otherwise.

#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>

namespace troupe::kernels {

/// Advantages and returns [B, T], 0 outside the mask.
struct advantage_result {
  at::Tensor advantages;
  at::Tensor returns;
};

/// rewards, values, mask [B, T]; γ, λ in [0, 1] → GAE advantages and returns = A + V.
expected<advantage_result> gae(const at::Tensor& rewards, const at::Tensor& values,
                               const at::Tensor& mask, double gamma, double lambda);

/// rewards, mask [B, T]; γ in [0, 1] → reward-to-go G_t = r_t + γ·G_next over valid tokens.
expected<at::Tensor> discounted_returns(const at::Tensor& rewards, const at::Tensor& mask,
                                        double gamma);

} // namespace troupe::kernels
