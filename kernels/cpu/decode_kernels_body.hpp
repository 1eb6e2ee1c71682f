// The CPU decode's kernels, compiled once per instruction set (NOTE [decode
// isa] in kernels/cpu/decode_isa.hpp). Not a header to include anywhere
// else: kernels/cpu/decode_avx512.cpp, decode_avx2.cpp and
// decode_baseline.cpp include it after their library headers, under their
// target pragma, with
//   TROUPE_DECODE_TABLE  the table's name in decode_tables (avx512, ...)
//   TROUPE_DECODE_LANES  floats per vector (16, 8, 4)
//   TROUPE_DECODE_TILE   tokens per panel tile (NOTE [packed panels])
// defined. Everything here has internal linkage but the table: the same
// names mean other code in each path. (The library templates it uses were
// defined before the pragma, so they stay baseline code wherever the linker
// keeps their one copy.)

// The 64-byte vectors below are always inlined: no call passes one, so the
// ABI note GCC gives for them does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace troupe::kernels::cpu {

namespace {

constexpr int kLanes = TROUPE_DECODE_LANES;
constexpr int64_t kPanelRows = 2 * kLanes;
constexpr int kPanelTokens = TROUPE_DECODE_TILE;

typedef float lanes __attribute__((vector_size(kLanes * sizeof(float))));
typedef float lanes_unaligned
    __attribute__((vector_size(kLanes * sizeof(float)), aligned(alignof(float)), may_alias));

#define TROUPE_INLINE inline __attribute__((always_inline))

TROUPE_INLINE lanes load(const float* p) {
  return *reinterpret_cast<const lanes_unaligned*>(p);
}

TROUPE_INLINE void store(float* p, lanes v) {
  *reinterpret_cast<lanes_unaligned*>(p) = v;
}

// The sum of the lanes, by halves (a tree, not dependent adds).
TROUPE_INLINE float hsum(lanes v) {
  typedef float four __attribute__((vector_size(4 * sizeof(float))));
#if TROUPE_DECODE_LANES == 16
  typedef float eight __attribute__((vector_size(8 * sizeof(float))));
  eight h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
            __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  four q = __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
#elif TROUPE_DECODE_LANES == 8
  four q = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
#else
  four q = v;
#endif
  return (q[0] + q[2]) + (q[1] + q[3]);
}

// ---- from the stored rows -------------------------------------------------------

// W[r] · x for one row: four chains along the row, so that the loads run
// ahead of the adds, and one sequential stream (consecutive rows continue
// it), which the hardware prefetchers follow best. At most 8 lanes a vector
// (256 bits, in AVX-512's registers too): a batch-1 step is bound by
// reading, and on Zen 4 the 512-bit form read 5-10 % slower (bench_decode,
// batch 1, 1 and 2 threads: its wider reduction at the end of every short
// row, and half as many loads in flight).
#if TROUPE_DECODE_LANES >= 8
constexpr int kRowLanes = 8;
#else
constexpr int kRowLanes = TROUPE_DECODE_LANES;
#endif
typedef float row_lanes __attribute__((vector_size(kRowLanes * sizeof(float))));
typedef float row_lanes_unaligned
    __attribute__((vector_size(kRowLanes * sizeof(float)), aligned(alignof(float)), may_alias));

TROUPE_INLINE row_lanes load_row(const float* p) {
  return *reinterpret_cast<const row_lanes_unaligned*>(p);
}

TROUPE_INLINE float row_hsum(row_lanes v) {
  typedef float four __attribute__((vector_size(4 * sizeof(float))));
#if TROUPE_DECODE_LANES >= 8
  four q = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
#else
  four q = v;
#endif
  return (q[0] + q[2]) + (q[1] + q[3]);
}

TROUPE_INLINE float row_dot(const float* w, const float* x, int64_t n) {
  constexpr int L = kRowLanes;
  row_lanes a0{}, a1{}, a2{}, a3{};
  int64_t i = 0;
  for (; i + 4 * L <= n; i += 4 * L) {
    a0 += load_row(w + i) * load_row(x + i);
    a1 += load_row(w + i + L) * load_row(x + i + L);
    a2 += load_row(w + i + 2 * L) * load_row(x + i + 2 * L);
    a3 += load_row(w + i + 3 * L) * load_row(x + i + 3 * L);
  }
  for (; i + L <= n; i += L)
    a0 += load_row(w + i) * load_row(x + i);
  float s = row_hsum((a0 + a1) + (a2 + a3));
  for (; i < n; ++i)
    s += w[i] * x[i];
  return s;
}

// A tile: kRows weight rows against up to kTokens tokens' inputs. Each
// weight row is loaded once per tile and used for every token of it, and a
// thread's rows stay in L1 while it walks the batch's tiles, so the weights
// stream from memory once per step whatever the batch. R · T accumulators,
// R + T loads: 16 and 8 fill AVX-512's 32 registers, 8 and 6 AVX2's 16.
constexpr int kRows = kLanes == 16 ? 4 : 2;
constexpr int kTokens = 4;

#if TROUPE_DECODE_LANES == 16
// Sums of 16 vectors in one: lane l holds the sum of v[kBitReversed4[l]]
// (each level adds the halves of two vectors, interleaved).
constexpr int kBitReversed4[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

TROUPE_INLINE lanes reduce16(const lanes* v) {
  lanes a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i)
    a[i] = __builtin_shufflevector(v[2 * i], v[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19,
                                   20, 21, 22, 23) +
           __builtin_shufflevector(v[2 * i], v[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26,
                                   27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)
    b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11,
                                   24, 25, 26, 27) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14,
                                   15, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)
    c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25,
                                   12, 13, 28, 29) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26,
                                   27, 14, 15, 30, 31);
  return __builtin_shufflevector(c[0], c[1], 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14,
                                 30) +
         __builtin_shufflevector(c[0], c[1], 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15,
                                 31);
}
#endif

// out[r][t] = W[r] · X[t] for R rows of a row-major [*, n] W and T rows of a
// [*, ldx] X.
template <int R, int T>
TROUPE_INLINE void tile(const float* w, int64_t n, const float* x, int64_t ldx,
                        float (&out)[kRows][kTokens]) {
  lanes acc[R][T];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t)
      acc[r][t] = lanes{};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    lanes wv[R], xv[T];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
      wv[r] = load(w + r * n + i);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t)
      xv[t] = load(x + t * ldx + i);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t)
        acc[r][t] += wv[r] * xv[t];
  }
#if TROUPE_DECODE_LANES == 16
  if constexpr (R * T == kLanes) {
    // Sixteen sums at once: a transposing tree of 15 vector adds instead of
    // one 16-lane reduction per output.
    lanes sums = reduce16(&acc[0][0]);
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t)
        out[r][t] = sums[kBitReversed4[r * T + t]];
  } else
#endif
  {
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t)
        out[r][t] = hsum(acc[r][t]);
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t)
      for (int64_t j = i; j < n; ++j)
        out[r][t] += w[r * n + j] * x[t * ldx + j];
}

// The tile for R rows and the token count t (the batch's remainder).
template <int R>
TROUPE_INLINE void tile_rows(int tokens, const float* w, int64_t n, const float* x, int64_t ldx,
                             float (&out)[kRows][kTokens]) {
  switch (tokens) {
  case 4:
    return tile<R, 4>(w, n, x, ldx, out);
  case 3:
    return tile<R, 3>(w, n, x, ldx, out);
  case 2:
    return tile<R, 2>(w, n, x, ldx, out);
  default:
    return tile<R, 1>(w, n, x, ldx, out);
  }
}

// For rows [r0, r1) of a row-major [*, n] W and `batch` inputs X [batch,
// n]: calls emit(row, token, W[row] · X[token]) for each pair. One token
// reads the rows one by one (bound by memory); more use tiles (bound by
// arithmetic).
template <class Emit>
TROUPE_INLINE void matmul_rows(const float* w, const float* x, int64_t batch, int64_t r0,
                               int64_t r1, int64_t n, Emit&& emit) {
  if (batch == 1) {
    for (int64_t r = r0; r < r1; ++r)
      emit(r, 0, row_dot(w + r * n, x, n));
    return;
  }
  float out[kRows][kTokens];
  for (int64_t r = r0; r < r1; r += kRows) {
    int rows = static_cast<int>(std::min<int64_t>(kRows, r1 - r));
    // The next tile's rows, from memory while this one computes (spread
    // over the token tiles: a burst would stall on the full miss queue).
    // Its rows are short streams the hardware prefetchers find late.
    const char* next = reinterpret_cast<const char*>(w + std::min(r1, r + kRows) * n);
    const char* next_end = reinterpret_cast<const char*>(w + std::min(r1, r + 2 * kRows) * n);
    const int64_t token_tiles = (batch + kTokens - 1) / kTokens;
    const int64_t per_tile = ((next_end - next) / 64 + token_tiles - 1) / token_tiles * 64;
    for (int64_t t = 0; t < batch; t += kTokens) {
      for (const char* e = std::min(next_end, next + per_tile); next < e; next += 64)
        __builtin_prefetch(next, 0, 3);
      int tokens = static_cast<int>(std::min<int64_t>(kTokens, batch - t));
      const float* wr = w + r * n;
      const float* xt = x + t * n;
      if (rows == kRows)
        tile_rows<kRows>(tokens, wr, n, xt, n, out);
      else
        for (int k = 0; k < rows; ++k) { // the range's last rows, one at a time
          float one[kRows][kTokens];
          tile_rows<1>(tokens, wr + k * n, n, xt, n, one);
          for (int j = 0; j < tokens; ++j)
            out[k][j] = one[0][j];
        }
      for (int k = 0; k < rows; ++k)
        for (int j = 0; j < tokens; ++j)
          emit(r + k, t + j, out[k][j]);
    }
  }
}

void linear_rows(const float* w, const float* bias, const float* x, int64_t batch, float* y,
                 int64_t ldy, int64_t r0, int64_t r1, int64_t n, bool accumulate) {
  matmul_rows(w, x, batch, r0, r1, n, [&](int64_t r, int64_t t, float v) {
    v += bias ? bias[r] : 0.0f;
    float& out = y[t * ldy + r];
    out = accumulate ? out + v : v;
  });
}

void swiglu_rows(const float* w1, const float* w3, const float* b1, const float* b3, const float* x,
                 int64_t batch, float* h, int64_t ldh, int64_t r0, int64_t r1, int64_t n) {
  // The gate first, into H; then the up projection combines with it.
  matmul_rows(w1, x, batch, r0, r1, n,
              [&](int64_t r, int64_t t, float g) { h[t * ldh + r] = g + (b1 ? b1[r] : 0.0f); });
  matmul_rows(w3, x, batch, r0, r1, n, [&](int64_t r, int64_t t, float u) {
    float g = h[t * ldh + r];
    h[t * ldh + r] = g / (1.0f + std::exp(-g)) * (u + (b3 ? b3[r] : 0.0f));
  });
}

// ---- from packed panels (NOTE [packed panels]) ------------------------------------

// out = silu(g) · u over one vector, at vector width: silu(g) = g ·
// sigmoid(g), with e = exp(-|g|) by the softmax's polynomial, sigmoid(g) =
// 1 / (1 + e) for g >= 0 and e / (1 + e) below. A NaN stays NaN.
TROUPE_INLINE void silu_times(const float* g, const float* u, float* out) {
  for (int j = 0; j < kLanes; ++j) {
    float e = detail::exp_nonpositive(-std::fabs(g[j]));
    out[j] = g[j] * ((g[j] >= 0.0f ? 1.0f : e) / (1.0f + e)) * u[j];
  }
}

// emit(t, sums) with the panel's rows · X[t] (kPanelRows floats) for T
// tokens of a k-major X (token t's k-th input at x[k · ldx + t]): 2 T
// accumulators, two weight vectors and a broadcast in the register file.
// Meanwhile it prefetches the lines [pf, pf_end), pf_step bytes (one or two
// lines) per step along k.
template <int T, class Emit>
TROUPE_INLINE void panel_tile(const float* panel, int64_t n, const float* x, int64_t ldx,
                              const char* pf, const char* pf_end, int64_t pf_step, Emit&& emit) {
  lanes lo[T], hi[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t)
    lo[t] = hi[t] = lanes{};
  for (int64_t k = 0; k < n; ++k, panel += kPanelRows, x += ldx) {
    if (pf < pf_end) {
      __builtin_prefetch(pf, 0, 2);
      __builtin_prefetch(pf + pf_step - 64, 0, 2);
      pf += pf_step;
    }
    lanes w0 = load(panel), w1 = load(panel + kLanes);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) { // a vector times a scalar: the scalar broadcast
      lo[t] += w0 * x[t];
      hi[t] += w1 * x[t];
    }
  }
  // Out of the registers first: what emit does with them must not make
  // the compiler keep the accumulators in memory during the loop.
  alignas(64) float out[T][kPanelRows];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    *reinterpret_cast<lanes*>(out[t]) = lo[t];
    *reinterpret_cast<lanes*>(out[t] + kLanes) = hi[t];
  }
  for (int t = 0; t < T; ++t)
    emit(t, static_cast<const float*>(out[t]));
}

// panel_tile<T> for a run-time T in [1, kPanelTokens].
template <int T = kPanelTokens, class Emit>
TROUPE_INLINE void panel_tile_of(int tokens, const float* panel, int64_t n, const float* x,
                                 int64_t ldx, const char* pf, const char* pf_end, int64_t pf_step,
                                 Emit&& emit) {
  if constexpr (T > 1)
    if (tokens < T)
      return panel_tile_of<T - 1>(tokens, panel, n, x, ldx, pf, pf_end, pf_step, emit);
  panel_tile<T>(panel, n, x, ldx, pf, pf_end, pf_step, emit);
}

// For panels [p0, p1) of a packed matrix with n columns and `batch` inputs
// X k-major [n, batch]: calls emit(panel, token, sums). The batch is cut
// into equal tiles of at most kPanelTokens; a panel stays in cache while
// its tiles run, so the weights stream from memory once per step.
template <class Emit>
TROUPE_INLINE void matmul_panels(const float* panels, const float* x, int64_t batch, int64_t p0,
                                 int64_t p1, int64_t n, Emit&& emit) {
  const int64_t tiles = (batch + kPanelTokens - 1) / kPanelTokens;
  // The next panel, from memory while this one computes: spread over the
  // tiles, a line (or two) per step along k.
  const int64_t lines = kPanelRows * n * 4 / 64, per_tile = (lines + tiles - 1) / tiles;
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

struct split_bias {
  const qkv_bias& b;
  void add(float* out, int64_t r0, int64_t n) const {
    const int64_t starts[3] = {0, b.q_rows, b.q_rows + b.kv_rows},
                  ends[3] = {b.q_rows, b.q_rows + b.kv_rows, b.q_rows + 2 * b.kv_rows};
    const float* parts[3] = {b.q, b.k, b.v};
    for (int s = 0; s < 3; ++s) {
      auto lo = std::max(r0, starts[s]), hi = std::min(r0 + n, ends[s]);
      if (lo < hi)
        add_bias(out + (lo - r0), parts[s], lo - starts[s], hi - lo);
    }
  }
};

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

void linear_panels(const float* panels, int64_t rows, const float* bias, const float* x,
                   int64_t batch, float* y, int64_t ldy, int64_t p0, int64_t p1, int64_t n,
                   bool accumulate) {
  linear_panels_impl(panels, rows, row_bias{bias}, x, batch, y, ldy, p0, p1, n, accumulate);
}

void qkv_panels(const float* panels, const qkv_bias& bias, const float* x, int64_t batch, float* y,
                int64_t p0, int64_t p1, int64_t n) {
  const int64_t rows = bias.q_rows + 2 * bias.kv_rows;
  linear_panels_impl(panels, rows, split_bias{bias}, x, batch, y, rows, p0, p1, n, false);
}

void swiglu_panels(const float* panels, int64_t hidden, const float* b1, const float* b3,
                   const float* x, int64_t batch, float* h, int64_t p0, int64_t p1, int64_t n) {
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

// ---- attention --------------------------------------------------------------------

detail::softmax_row_stats softmax_row(const float* x, int64_t n, float scale, float* weights);

// Calls fn(position, row, ahead) for positions [p0, p1) of a request, row
// pointing at its `kv_head` in `pool` through the block table (a block at a
// time: no division per position) and ahead at the row one block later
// (nullptr past p1): the row to prefetch, as the pool's blocks need not be
// adjacent.
template <class Fn>
TROUPE_INLINE void each_cached(const float* pool, const int32_t* block_table, int64_t block_size,
                               int64_t n_kv, int64_t kv_head, int64_t head_dim, int64_t p0,
                               int64_t p1, Fn&& fn) {
  const int64_t stride = n_kv * head_dim; // floats from one slot to the next
  auto at = [&](int64_t blk, int64_t offset) {
    return pool + (static_cast<int64_t>(block_table[blk]) * block_size + offset) * stride +
           kv_head * head_dim;
  };
  for (int64_t p = p0, blk = p0 / block_size; p < p1; ++blk) {
    const int64_t offset = p - blk * block_size, end = std::min(p1, (blk + 1) * block_size);
    const float* row = at(blk, offset);
    const float* ahead = end < p1 ? at(blk + 1, offset) : nullptr;
    for (; p < end; ++p, row += stride) {
      fn(p, row, p + block_size < p1 ? ahead : nullptr);
      ahead += ahead ? stride : 0;
    }
  }
}

// Prefetches n floats from p, a line at a time (nothing for a null p).
TROUPE_INLINE void prefetch_floats(const float* p, int64_t n) {
  if (!p)
    return;
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t b = 0; b < n * static_cast<int64_t>(sizeof(float)); b += 64)
    __builtin_prefetch(c + b, 0, 3);
}

// A part of one request's attention (decode_kernels.hpp): for each query
// head h reading KV heads [j0, j1), over positions [p0, p1),
//   max[h] = max_p s_p,  sum[h] = Σ_p exp(scale (s_p − max[h])),
//   out[h] = Σ_p exp(scale (s_p − max[h])) V_p   (not yet divided by sum),
// with s_p = q[h] · K_p and scale = 1 / sqrt(D). It reads the K/V rows in
// place through the block table, a position at a time: a position's rows
// of these KV heads are adjacent in the pools, so each pass over K or V is
// one sequential stream, each K/V row is read once for its whole group of
// query heads, and each pass prefetches its rows a block ahead (the next
// block need not be adjacent, where the hardware prefetchers would follow).
// q and out are the request's rows of every head [n_heads · D]; max and sum
// are indexed from the part's first head; scores holds (j1 − j0) · group ·
// (p1 − p0) floats. An empty range gives max −inf and sum 0; a NaN score or
// a non-finite max gives sum NaN (and that head's out NaN).
void attend_heads(const float* q, const float* k_cache, const float* v_cache,
                  const int32_t* block_table, int64_t block_size, int64_t n_kv, int64_t group,
                  int64_t head_dim, attention_part part, float* scores, float* max, float* sum,
                  float* out) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int64_t h0 = part.j0 * group, heads = (part.j1 - part.j0) * group;
  const int64_t n = part.p1 - part.p0, span = (part.j1 - part.j0) * head_dim;
  auto score = [&](int64_t h) { return scores + (h - h0) * n; };
  each_cached(k_cache, block_table, block_size, n_kv, part.j0, head_dim, part.p0, part.p1,
              [&](int64_t p, const float* k, const float* ahead) {
                prefetch_floats(ahead, span);
                for (int64_t h = h0; h < h0 + heads; ++h)
                  score(h)[p - part.p0] =
                      row_dot(q + h * head_dim, k + (h / group - part.j0) * head_dim, head_dim);
              });
  // The weights exp(scale · (s − max)) in place, at vector width (the
  // sampler's kernel); a NaN score makes its head's sum NaN, as ATen's
  // output.
  for (int64_t h = h0; h < h0 + heads; ++h) {
    std::fill_n(out + h * head_dim, head_dim, 0.0f);
    if (n == 0) {
      max[h - h0] = -std::numeric_limits<float>::infinity();
      sum[h - h0] = 0.0f;
      continue;
    }
    auto stats = softmax_row(score(h), n, scale, score(h));
    max[h - h0] = stats.max;
    sum[h - h0] =
        stats.argmax < 0 ? std::numeric_limits<float>::quiet_NaN() : static_cast<float>(stats.sum);
  }
  const bool vectors = head_dim % kLanes == 0;
  each_cached(v_cache, block_table, block_size, n_kv, part.j0, head_dim, part.p0, part.p1,
              [&](int64_t p, const float* v, const float* ahead) {
                prefetch_floats(ahead, span);
                for (int64_t h = h0; h < h0 + heads; ++h) {
                  const float w = score(h)[p - part.p0];
                  const float* vh = v + (h / group - part.j0) * head_dim;
                  float* o = out + h * head_dim;
                  if (vectors)
                    for (int64_t d = 0; d < head_dim; d += kLanes)
                      store(o + d, load(o + d) + w * load(vh + d));
                  else
                    for (int64_t d = 0; d < head_dim; ++d)
                      o[d] += w * vh[d];
                }
              });
  for (int64_t h = h0; h < h0 + heads; ++h)
    if (std::isnan(sum[h - h0])) // its scores were never turned into weights
      std::fill_n(out + h * head_dim, head_dim, std::numeric_limits<float>::quiet_NaN());
}

// ---- the sampler's softmax row (kernels/cpu/softmax_row.hpp) -----------------------

// The loops below are straight-line over a block of 16, which GCC turns into
// vector code without -ffast-math (a running `m = max(m, x)` or `s += x` is
// a serial chain it may not reorder).
constexpr int kBlock = 16;

detail::softmax_row_stats softmax_row(const float* x, int64_t n, float scale, float* weights) {
  detail::softmax_row_stats s;
  // Pass 1: max and a NaN count.
  float lane_max[kBlock];
  int32_t lane_nan[kBlock];
  for (int l = 0; l < kBlock; ++l) {
    lane_max[l] = -std::numeric_limits<float>::infinity();
    lane_nan[l] = 0;
  }
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int l = 0; l < kBlock; ++l) {
      float v = x[i + l];
      lane_max[l] = v > lane_max[l] ? v : lane_max[l];
      lane_nan[l] += v != v;
    }
  float m = -std::numeric_limits<float>::infinity();
  int32_t nans = 0;
  for (int l = 0; l < kBlock; ++l) {
    m = lane_max[l] > m ? lane_max[l] : m;
    nans += lane_nan[l];
  }
  for (; i < n; ++i) {
    m = x[i] > m ? x[i] : m;
    nans += x[i] != x[i];
  }
  s.max = m;
  if (nans != 0 || !std::isfinite(m))
    return s; // argmax -1: no distribution
  // The lowest index of the max (what a first-wins scan gives): a block at
  // a time at vector width, then the element within the first block that
  // holds it (an element-wise scan with an early exit stays scalar).
  int64_t from = 0;
  for (; from + kBlock <= n; from += kBlock) {
    int32_t hits = 0;
    for (int l = 0; l < kBlock; ++l)
      hits |= x[from + l] == m;
    if (hits != 0)
      break;
  }
  for (int64_t v = from; v < n; ++v)
    if (x[v] == m) {
      s.argmax = v;
      break;
    }
  // Pass 2: Σ exp(scale · (x − max)), in double lanes.
  double lane_sum[kBlock] = {};
  float e[kBlock];
  i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (int l = 0; l < kBlock; ++l)
      e[l] = detail::exp_nonpositive(scale * (x[i + l] - m));
    for (int l = 0; l < kBlock; ++l)
      lane_sum[l] += static_cast<double>(e[l]);
    if (weights != nullptr)
      std::memcpy(weights + i, e, sizeof e);
  }
  double total = 0;
  for (int l = 0; l < kBlock; ++l)
    total += lane_sum[l];
  for (; i < n; ++i) {
    float w = detail::exp_nonpositive(scale * (x[i] - m));
    total += static_cast<double>(w);
    if (weights != nullptr)
      weights[i] = w;
  }
  s.sum = total;
  return s;
}

float dot(const float* a, const float* b, int64_t n) {
  return row_dot(a, b, n);
}

#undef TROUPE_INLINE

} // namespace

namespace decode_tables {

const decode_kernels TROUPE_DECODE_TABLE = {
    decode_isa::TROUPE_DECODE_TABLE,
    true,
    kLanes,
    kPanelRows,
    kPanelTokens,
    kRows,
    linear_rows,
    swiglu_rows,
    linear_panels,
    qkv_panels,
    swiglu_panels,
    attend_heads,
    dot,
    softmax_row,
};

} // namespace decode_tables

} // namespace troupe::kernels::cpu
