#pragma once
// Batch-invariant CPU kernels over raw floats (no LibTorch): the pieces of
// a decoder forward whose every output element is computed by one fixed
// sequence of float operations, whatever else is in the batch.
//
// NOTE [batch-invariant kernels]: a GEMM library picks its blocking, its
// kernel and its threads' split of the reduction by the shape of the whole
// call, and ATen's element-wise loops finish a thread's chunk in scalar
// code, so a token's logits change in the last bits with the batch it is
// computed in: alone, among 32 others, in a trainer's padded batch or as
// one decode step against a KV cache. These kernels fix the order instead:
//   dot products   8 lanes, lane l summing the products k ≡ l (mod 8) in
//                  order of k (one fused multiply-add each on the avx2
//                  path, a multiply then an add on baseline), the lanes
//                  added as ((0+4)+(2+6)) + ((1+5)+(3+7)), then the tail
//                  k ≥ 8⌊n/8⌋ one at a time, then the bias;
//   a linear layer every output is such a dot product of its input row and
//                  a weight row; tiles of rows × outputs only share loads;
//   RMSNorm        the sum of squares as a dot product of the row with
//                  itself, then 1/sqrt(mean + eps), x · r · weight;
//   attention      per query head over its keys 0..L-1 in order: scores
//                  as dot products times the scale, their max, exp(s − max)
//                  (kernels/cpu/softmax_row.hpp's polynomial), the sum and
//                  the weighted values accumulated key by key, divided by
//                  the sum last;
//   SwiGLU, RoPE   element by element, one row at a time.
// Callers split work over rows, outputs or heads — never over a reduction
// — so any thread count gives the same bits. The path (avx2 or baseline)
// is chosen once per process by the CPU: engine and trainer in one process
// (or on machines of one instruction set) agree bit for bit.

#include <cstdint>

namespace troupe::kernels::cpu {

struct invariant_kernels {
  /// "avx2" (x86-64-v3: AVX2 + FMA) or "baseline".
  const char* isa;
  /// y[t][o] = W[o] · x[t] (+ bias[o]) for rows t in [0, rows) and outputs
  /// o in [o0, o1): x [rows, n] (row stride ldx), W [*, n] row-major, y
  /// [rows, ldy]; bias may be null.
  void (*linear)(const float* x, int64_t ldx, int64_t rows, int64_t n, const float* w,
                 const float* bias, float* y, int64_t ldy, int64_t o0, int64_t o1);
  /// y = x / sqrt(mean(x²) + eps) · weight over one row of n.
  void (*rms_norm)(const float* x, int64_t n, const float* weight, float eps, float* y);
  /// out[d] = Σ_j softmax_j(scale · q·k_j) · v_j[d] over keys j in [0, keys):
  /// key j's vectors at k + slots[j] · stride and v + slots[j] · stride (d
  /// floats each). `scores` holds `keys` floats of scratch.
  void (*attend)(const float* q, int64_t d, const float* k, const float* v, int64_t stride,
                 const int64_t* slots, int64_t keys, float scale, float* scores, float* out);
  /// h[i] = silu(a[i]) · b[i] for i in [0, n).
  void (*swiglu)(const float* a, const float* b, int64_t n, float* h);
  /// Rotates one head of d (rotate-half layout) in place by cos/sin [d/2].
  void (*rope)(float* x, int64_t d, const float* cos, const float* sin);
};

/// This machine's path (chosen once: avx2 where the CPU has x86-64-v3).
const invariant_kernels& invariant_kernels_here();

namespace invariant_tables {
extern const invariant_kernels avx2;
extern const invariant_kernels baseline;
} // namespace invariant_tables

} // namespace troupe::kernels::cpu
