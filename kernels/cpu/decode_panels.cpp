#include "kernels/cpu/decode_panels.hpp"

#include "kernels/cpu/decode_lanes.hpp"
#include "kernels/cpu/fused_decode.hpp"
#include "kernels/cpu/softmax_row.hpp"

#include <algorithm>
#include <cmath>

namespace troupe::kernels::cpu {

namespace decode_impl {

namespace {

// out = silu(g) · u over 16 floats, at vector width: silu(g) = g ·
// sigmoid(g), with e = exp(-|g|) by the softmax's polynomial, sigmoid(g) =
// 1 / (1 + e) for g >= 0 and e / (1 + e) below. A NaN stays NaN.
TROUPE_INLINE void silu_times(const float* g, const float* u, float* out) {
  for (int j = 0; j < kLanes; ++j) {
    float e = detail::exp_nonpositive(-std::fabs(g[j]));
    out[j] = g[j] * ((g[j] >= 0.0f ? 1.0f : e) / (1.0f + e)) * u[j];
  }
}

static_assert(kPanelRows == 2 * kLanes, "a panel's rows are two vectors");

// Tokens per panel tile at most: 2 T accumulators + 2 weight vectors + a
// broadcast in the AVX-512 register file (32 registers), in AVX2's (16, two
// per vector) or SSE's (16, four per vector: it spills whatever T).
int max_panel_tokens() {
  static const int tokens = __builtin_cpu_supports("avx512f") ? 12
                            : __builtin_cpu_supports("avx2")  ? 2
                                                              : 1;
  return tokens;
}

// emit(t, sums) with the panel's rows · X[t] (kPanelRows floats) for T
// tokens of a k-major X (token t's k-th input at x[k · ldx + t]).
// Meanwhile it prefetches the lines [pf, pf_end), pf_step bytes (one or two
// lines) per step along k.
template <int T, class Emit>
TROUPE_INLINE void panel_tile(const float* panel, int64_t n, const float* x, int64_t ldx,
                              const char* pf, const char* pf_end, int64_t pf_step, Emit&& emit) {
  lanes lo[T], hi[T];
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t)
    lo[t] = hi[t] = lanes{};
  for (int64_t k = 0; k < n; ++k, panel += kPanelRows, x += ldx) {
    if (pf < pf_end) {
      __builtin_prefetch(pf, 0, 2);
      __builtin_prefetch(pf + pf_step - 64, 0, 2);
      pf += pf_step;
    }
    lanes w0 = load(panel), w1 = load(panel + kLanes);
#pragma GCC unroll 12
    for (int t = 0; t < T; ++t) { // a vector times a scalar: the scalar broadcast
      lo[t] += w0 * x[t];
      hi[t] += w1 * x[t];
    }
  }
  // Out of the registers first: what emit does with them must not make
  // the compiler keep the accumulators in memory during the loop.
  alignas(64) float out[T][kPanelRows];
#pragma GCC unroll 12
  for (int t = 0; t < T; ++t) {
    *reinterpret_cast<lanes*>(out[t]) = lo[t];
    *reinterpret_cast<lanes*>(out[t] + kLanes) = hi[t];
  }
  for (int t = 0; t < T; ++t)
    emit(t, static_cast<const float*>(out[t]));
}

template <class Emit>
TROUPE_INLINE void panel_tile_of(int tokens, const float* panel, int64_t n, const float* x,
                                 int64_t ldx, const char* pf, const char* pf_end, int64_t pf_step,
                                 Emit&& emit) {
  switch (tokens) {
#define TROUPE_PANEL_CASE(T)                                                                       \
  case T:                                                                                          \
    return panel_tile<T>(panel, n, x, ldx, pf, pf_end, pf_step, emit);
    TROUPE_PANEL_CASE(12)
    TROUPE_PANEL_CASE(11)
    TROUPE_PANEL_CASE(10)
    TROUPE_PANEL_CASE(9)
    TROUPE_PANEL_CASE(8)
    TROUPE_PANEL_CASE(7)
    TROUPE_PANEL_CASE(6)
    TROUPE_PANEL_CASE(5)
    TROUPE_PANEL_CASE(4)
    TROUPE_PANEL_CASE(3)
    TROUPE_PANEL_CASE(2)
#undef TROUPE_PANEL_CASE
  default:
    return panel_tile<1>(panel, n, x, ldx, pf, pf_end, pf_step, emit);
  }
}

// For panels [p0, p1) of a packed matrix with n columns and `batch` inputs
// X k-major [n, batch]: calls emit(panel, token, sums). The batch is cut
// into equal tiles of at most max_panel_tokens(); a panel stays in cache
// while its tiles run, so the weights stream from memory once per step.
template <class Emit>
TROUPE_INLINE void matmul_panels(const float* panels, const float* x, int64_t batch, int64_t p0,
                                 int64_t p1, int64_t n, Emit&& emit) {
  const int64_t most = max_panel_tokens();
  const int64_t tiles = (batch + most - 1) / most;
  // The next panel, from memory while this one computes: spread over the
  // tiles, a line per step along k (two when one tile must fetch more lines
  // than it has steps; a panel is 2 n lines).
  const int64_t lines = 2 * n, per_tile = (lines + tiles - 1) / tiles;
  const int64_t pf_step = per_tile > n ? 128 : 64;
  for (int64_t p = p0; p < p1; ++p) {
    const float* panel = panels + p * kPanelRows * n;
    const char* next = reinterpret_cast<const char*>(panel + (p + 1 < p1 ? kPanelRows * n : 0));
    const char* next_end = next + (p + 1 < p1 ? 64 * lines : 0);
    for (int64_t i = 0, t0 = 0; i < tiles; ++i) {
      const int64_t t1 = batch * (i + 1) / tiles;
      const char* pf = std::min(next_end, next + 64 * per_tile * i);
      panel_tile_of(static_cast<int>(t1 - t0), panel, n, x + t0, batch, pf,
                    std::min(next_end, pf + 64 * per_tile), pf_step,
                    [&](int t, const float* sums) { emit(p, t0 + t, sums); });
      t0 = t1;
    }
  }
}

// Adds bias[r0, r0 + n) to out[0, n) (a null bias adds nothing). Biases are
// added in loops of their own: a loop that reads a bias only when it is not
// null would be vectorised into masked loads, which at a null address cost
// a microcode assist each.
TROUPE_INLINE void add_bias(float* out, const float* bias, int64_t r0, int64_t n) {
  if (bias)
    for (int64_t j = 0; j < n; ++j)
      out[j] += bias[r0 + j];
}

struct row_bias {
  const float* b;
  void add(float* out, int64_t r0, int64_t n) const { add_bias(out, b, r0, n); }
};

// Y[t][r] (+)= W[r] · X[t] + bias[r] for the rows of panels [p0, p1) of a
// packed W with `rows` rows; X k-major [n, batch], Y [batch, ldy].
template <class Bias>
TROUPE_INLINE void linear_panels_impl(const float* panels, int64_t rows, const Bias& bias,
                                      const float* x, int64_t batch, float* y, int64_t ldy,
                                      int64_t p0, int64_t p1, int64_t n, bool accumulate) {
  matmul_panels(panels, x, batch, p0, p1, n, [&](int64_t p, int64_t t, const float* sums) {
    const int64_t r0 = p * kPanelRows;
    const int64_t valid = std::min<int64_t>(kPanelRows, rows - r0);
    float v[kPanelRows];
    for (int j = 0; j < kPanelRows; ++j)
      v[j] = sums[j];
    bias.add(v, r0, valid);
    float* out = y + t * ldy + r0;
    if (valid == kPanelRows) { // (a copy of a run-time length becomes rep movs: slow to start)
      for (int h = 0; h < kPanelRows; h += kLanes)
        store(out + h, accumulate ? load(out + h) + load(v + h) : load(v + h));
      return;
    }
    for (int64_t j = 0; j < valid; ++j)
      out[j] = accumulate ? out[j] + v[j] : v[j];
  });
}

} // namespace

void qkv_bias::add(float* out, int64_t r0, int64_t n) const {
  const int64_t starts[3] = {0, q_rows, q_rows + kv_rows},
                ends[3] = {q_rows, q_rows + kv_rows, q_rows + 2 * kv_rows};
  const float* b[3] = {q, k, v};
  for (int s = 0; s < 3; ++s) {
    auto lo = std::max(r0, starts[s]), hi = std::min(r0 + n, ends[s]);
    if (lo < hi)
      add_bias(out + (lo - r0), b[s], lo - starts[s], hi - lo);
  }
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void
linear_panels(const float* panels, int64_t rows, const float* bias, const float* x, int64_t batch,
              float* y, int64_t ldy, int64_t p0, int64_t p1, int64_t n, bool accumulate) {
  linear_panels_impl(panels, rows, row_bias{bias}, x, batch, y, ldy, p0, p1, n, accumulate);
}

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void
qkv_panels(const float* panels, const qkv_bias& bias, const float* x, int64_t batch, float* y,
           int64_t p0, int64_t p1, int64_t n) {
  const int64_t rows = bias.q_rows + 2 * bias.kv_rows;
  linear_panels_impl(panels, rows, bias, x, batch, y, rows, p0, p1, n, false);
}

// H k-major [hidden, batch]: H[r][t] = silu(W1[r] · X[t] + b1) · (W3[r] ·
// X[t] + b3) for the hidden rows of SwiGLU panels [p0, p1).
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void
swiglu_panels(const float* panels, int64_t hidden, const float* b1, const float* b3, const float* x,
              int64_t batch, float* h, int64_t p0, int64_t p1, int64_t n) {
  constexpr int64_t kHalf = kPanelRows / 2;
  matmul_panels(panels, x, batch, p0, p1, n, [&](int64_t p, int64_t t, const float* sums) {
    const int64_t r0 = p * kHalf;
    const int valid = static_cast<int>(std::min<int64_t>(kHalf, hidden - r0));
    float gate[kHalf], up[kHalf], out[kHalf];
    for (int j = 0; j < kHalf; ++j) {
      gate[j] = sums[j];
      up[j] = sums[kHalf + j];
    }
    add_bias(gate, b1, r0, valid);
    add_bias(up, b3, r0, valid);
    silu_times(gate, up, out);
    for (int j = 0; j < valid; ++j)
      h[(r0 + j) * batch + t] = out[j];
  });
}

} // namespace decode_impl

// ---- packing ----

int64_t packed_size(int64_t rows, int64_t cols) {
  return (rows + kPanelRows - 1) / kPanelRows * kPanelRows * cols;
}

namespace {

// Rows [r0, r0 + n) of a row-major W [*, cols], n <= kPanelRows, into the
// first n of `width` rows of a panel at `out` (zeros after them): a k-row
// of the panel at a time, so that the writes are sequential (the reads
// touch n lines that stay in L1 for the next 15 k).
void pack_rows(const float* w, int64_t r0, int64_t n, int64_t cols, int64_t width, float* out) {
  const float* rows = w + r0 * cols;
  for (int64_t k = 0; k < cols; ++k) {
    float* o = out + k * kPanelRows;
    for (int64_t j = 0; j < n; ++j)
      o[j] = rows[j * cols + k];
    for (int64_t j = n; j < width; ++j)
      o[j] = 0.0f;
  }
}

} // namespace

void pack_panels(const float* w, int64_t rows, int64_t cols, float* out) {
  for (int64_t p = 0; p < rows; p += kPanelRows, out += kPanelRows * cols)
    pack_rows(w, p, std::min(kPanelRows, rows - p), cols, kPanelRows, out);
}

void pack_swiglu(const float* w1, const float* w3, int64_t rows, int64_t cols, float* out) {
  constexpr int64_t kHalf = kPanelRows / 2;
  for (int64_t p = 0; p < rows; p += kHalf, out += kPanelRows * cols) {
    const int64_t n = std::min(kHalf, rows - p);
    pack_rows(w1, p, n, cols, kHalf, out);
    pack_rows(w3, p, n, cols, kHalf, out + kHalf);
  }
}

} // namespace troupe::kernels::cpu
