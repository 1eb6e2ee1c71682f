#pragma once
// One row of the sampler's softmax in a fused pass over raw floats (no
// LibTorch): max, argmax and the normaliser of softmax(scale · x), optionally
// writing the unnormalised probabilities. actors/inference/sampler.cpp calls
// it per logits row from ATen's thread pool. Compiled with -O3 for each
// instruction-set path (NOTE [decode isa] in kernels/cpu/decode_isa.hpp;
// the widest this CPU runs unless one is named), so the vocabulary scans run
// at vector width: at batch 32 these rows are 32 × 32000 floats per
// decode step, which ATen's log_softmax plus a scalar argmax took ~2.6 ms for.

#include "kernels/cpu/decode_isa.hpp"

#include <cstdint>
#include <cstring>

namespace troupe::kernels::detail {

// exp(y) for y <= 0, branch-free so a block vectorises. y = n·ln2 + r with
// |r| <= ln2/2; exp(r) by the classic single-precision polynomial (Cephes'
// expf coefficients); 2^n built in the exponent bits. Below -87.3 (2^-126,
// the smallest normal float) the result is 0, as is exp(-inf) (and exp(NaN):
// callers that must see NaN check for it). Inlined into each caller's
// vector loops (the softmax row, SiLU in kernels/cpu/fused_decode.cpp).
inline float exp_nonpositive(float y) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f; // 1.5 · 2^23: adding it rounds to an integer
  bool underflow = !(y > -87.3f);       // NaN too
  float yc = underflow ? 0.0f : y;
  float nf = (yc * kLog2e + kRound) - kRound;
  float r = (yc - nf * kLn2Hi) - nf * kLn2Lo;
  float z = r * r;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * z + r + 1.0f;
  int32_t bits = (static_cast<int32_t>(nf) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof two_n);
  return underflow ? 0.0f : p * two_n;
}

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
/// The same on a named path (one this CPU supports; for tests and benches).
softmax_row_stats softmax_row(const float* x, int64_t n, float scale, float* weights,
                              cpu::decode_isa isa);

/// log softmax(scale · x)[v] from the stats: scale · (x_v − max) − log(sum).
double softmax_row_logprob(const softmax_row_stats& s, float x_v, float scale);

} // namespace troupe::kernels::detail
