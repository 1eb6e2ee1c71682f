#pragma once
// The per-instruction-set kernels of the CPU decode (NOTE [decode isa] in
// kernels/cpu/decode_isa.hpp): one table of function pointers per path,
// each filled by kernels/cpu/decode_kernels_body.hpp compiled for that path
// (private to kernels/cpu).

#include "kernels/cpu/decode_isa.hpp"
#include "kernels/cpu/softmax_row.hpp"

#include <cstdint>

namespace troupe::kernels::cpu {

// The biases of rows [r0, r0 + n) of the q | k | v row space (any may be null).
struct qkv_bias {
  const float *q, *k, *v;
  int64_t q_rows, kv_rows;
};

// A part of one request's attention: its query heads that read KV heads
// [j0, j1), over its cached positions [p0, p1).
struct attention_part {
  int64_t j0, j1, p0, p1;
};

struct decode_kernels {
  decode_isa isa;
  /// Whether the table was compiled in (the x86 paths on x86 only).
  bool built;
  /// Floats per vector; rows per packed panel (two vectors); tokens per
  /// panel tile at most (what the register file holds: NOTE [packed
  /// panels]); rows per stored-row tile (a share of rows is a multiple).
  int64_t lanes, panel_rows, panel_tokens, row_tile;

  // ---- from the stored rows (row-major [out, in]) ----
  /// Y[t][r] (+)= W[r] · X[t] + bias[r] for rows [r0, r1); X [batch, n], Y [batch, ldy].
  void (*linear_rows)(const float* w, const float* bias, const float* x, int64_t batch, float* y,
                      int64_t ldy, int64_t r0, int64_t r1, int64_t n, bool accumulate);
  /// H[t][r] = silu(W1[r] · X[t] + b1) · (W3[r] · X[t] + b3) for rows [r0, r1).
  void (*swiglu_rows)(const float* w1, const float* w3, const float* b1, const float* b3,
                      const float* x, int64_t batch, float* h, int64_t ldh, int64_t r0, int64_t r1,
                      int64_t n);

  // ---- from packed panels; X k-major [n, batch] ----
  /// Y[t][r] (+)= W[r] · X[t] + bias[r] for the rows of panels [p0, p1) of
  /// a packed W with `rows` rows; Y [batch, ldy].
  void (*linear_panels)(const float* panels, int64_t rows, const float* bias, const float* x,
                        int64_t batch, float* y, int64_t ldy, int64_t p0, int64_t p1, int64_t n,
                        bool accumulate);
  /// The q | k | v rows into Y [batch, q_rows + 2 kv_rows].
  void (*qkv_panels)(const float* panels, const qkv_bias& bias, const float* x, int64_t batch,
                     float* y, int64_t p0, int64_t p1, int64_t n);
  /// H k-major [hidden, batch]: H[r][t] = silu(W1[r] · X[t] + b1) · (W3[r]
  /// · X[t] + b3) for the hidden rows of SwiGLU panels (pack_swiglu) [p0, p1).
  void (*swiglu_panels)(const float* panels, int64_t hidden, const float* b1, const float* b3,
                        const float* x, int64_t batch, float* h, int64_t p0, int64_t p1, int64_t n);

  // ---- attention, the sampler ----
  /// A part of one request's attention, unnormalised: per query head the
  /// largest score, the sum of the softmax numerators and their weighted sum
  /// of V rows (kernels/cpu/decode_kernels_body.hpp says how); parts of one
  /// head over disjoint positions combine exactly (combine_attention in
  /// kernels/cpu/fused_decode.cpp).
  void (*attend_heads)(const float* q, const float* k_cache, const float* v_cache,
                       const int32_t* block_table, int64_t block_size, int64_t n_kv, int64_t group,
                       int64_t head_dim, attention_part part, float* scores, float* max, float* sum,
                       float* out);
  float (*dot)(const float* a, const float* b, int64_t n);
  detail::softmax_row_stats (*softmax_row)(const float* x, int64_t n, float scale, float* weights);
};

/// The table of a path not compiled for this architecture (built false, no
/// kernels: cpu_supports refuses it before any call).
inline decode_kernels unbuilt_table(decode_isa isa) {
  return {isa,     false,   0,       0,       0,       0,       nullptr,
          nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
}

/// The table of a path this CPU supports (`automatic` resolved); the caller
/// has checked cpu_supports.
const decode_kernels& decode_kernels_of(decode_isa isa);

namespace decode_tables {
extern const decode_kernels avx512, avx2, baseline;
} // namespace decode_tables

} // namespace troupe::kernels::cpu
