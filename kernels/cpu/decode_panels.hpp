#pragma once
// The fused decode's projections from packed panels (NOTE [packed panels] in
// kernels/cpu/fused_decode.hpp), for its step (kernels/cpu/fused_decode.cpp;
// private to kernels/cpu). Each computes the rows of panels [p0, p1) for
// `batch` tokens whose inputs are k-major ([n, batch]).

#include <cstdint>

namespace troupe::kernels::cpu::decode_impl {

// The biases of rows [r0, r0 + n) of the q | k | v row space (any may be null).
struct qkv_bias {
  const float *q, *k, *v;
  int64_t q_rows, kv_rows;
  void add(float* out, int64_t r0, int64_t n) const;
};

// Y[t][r] (+)= W[r] · X[t] + bias[r] for a packed W with `rows` rows; Y is
// [batch, ldy].
void linear_panels(const float* panels, int64_t rows, const float* bias, const float* x,
                   int64_t batch, float* y, int64_t ldy, int64_t p0, int64_t p1, int64_t n,
                   bool accumulate);

// The q | k | v rows into Y [batch, q_rows + 2 kv_rows].
void qkv_panels(const float* panels, const qkv_bias& bias, const float* x, int64_t batch, float* y,
                int64_t p0, int64_t p1, int64_t n);

// H k-major [hidden, batch]: H[r][t] = silu(W1[r] · X[t] + b1) · (W3[r] ·
// X[t] + b3) for the hidden rows of SwiGLU panels (pack_swiglu) [p0, p1).
void swiglu_panels(const float* panels, int64_t hidden, const float* b1, const float* b3,
                   const float* x, int64_t batch, float* h, int64_t p0, int64_t p1, int64_t n);

} // namespace troupe::kernels::cpu::decode_impl
