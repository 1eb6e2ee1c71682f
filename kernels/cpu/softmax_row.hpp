#pragma once
// One row of the sampler's softmax in a fused pass over raw floats (no
// LibTorch): max, argmax and the normaliser of softmax(scale · x), optionally
// writing the unnormalised probabilities. actors/inference/sampler.cpp calls
// it per logits row from ATen's thread pool. Compiled with -O3 and cloned for
// AVX-512 / AVX2 / baseline x86-64 (chosen at load time), so the vocabulary
// scans run at vector width: at batch 32 these rows are 32 × 32000 floats per
// decode step, which ATen's log_softmax plus a scalar argmax took ~2.6 ms for.

#include <cstdint>

namespace troupe::kernels::detail {

struct softmax_row_stats {
  /// max over the row of x (unscaled).
  float max = 0;
  /// The lowest index holding `max`; -1 when the row has a NaN, or its max
  /// is not finite (all -inf, or a +inf): no distribution to sample.
  int64_t argmax = -1;
  /// Σ_v exp(scale · (x_v − max)) (≥ 1 when argmax ≥ 0).
  double sum = 0;
};

/// Stats of softmax(scale · x) over x[0, n), scale > 0. When `weights` is not
/// null it receives exp(scale · (x_v − max)) for every v (0 for -inf logits).
/// exp is a degree-7 polynomial after range reduction (relative error below
/// 2e-7, the float rounding scale); the sum accumulates in double.
softmax_row_stats softmax_row(const float* x, int64_t n, float scale, float* weights);

/// log softmax(scale · x)[v] from the stats: scale · (x_v − max) − log(sum).
double softmax_row_logprob(const softmax_row_stats& s, float x_v, float scale);

} // namespace troupe::kernels::detail
