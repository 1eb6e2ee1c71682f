#include "kernels/cpu/fused_decode.hpp"

#include "kernels/cpu/softmax_row.hpp"

// The 64-byte vector helpers below are always inlined: no call passes one,
// so the ABI note GCC gives for them does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TROUPE_PAUSE() _mm_pause()
#else
#define TROUPE_PAUSE() ((void)0)
#endif

namespace troupe::kernels::cpu {

// ---- thread_team ---------------------------------------------------------------

namespace {

// Spins before a member sleeps between runs: decode steps follow each other
// within ~0.1 ms (the sampler runs in between), but after the last one the
// spinning would take a core from whatever runs next (a job's other roles).
constexpr int kIdleSpins = 3000;
// Spins at a barrier before yielding (the members arrive microseconds apart).
constexpr int kBarrierSpins = 2000;

} // namespace

thread_team::thread_team(int size) : size_(std::max(1, size)) {
  for (int i = 1; i < size_; ++i)
    threads_.emplace_back([this, i] { work(i); });
}

thread_team::~thread_team() {
  {
    std::lock_guard<std::mutex> lock{mu_};
    stop_.store(true);
    generation_.fetch_add(1);
  }
  wake_.notify_all();
  for (auto& t : threads_)
    t.join();
}

void thread_team::work(int member) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen) {
      if (++spins < kIdleSpins) {
        TROUPE_PAUSE();
        continue;
      }
      std::unique_lock<std::mutex> lock{mu_};
      sleepers_.fetch_add(1);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      sleepers_.fetch_sub(1);
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load())
      return;
    (*job_)(member);
    finished_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void thread_team::run(const std::function<void(int)>& fn) {
  if (size_ == 1) {
    fn(0);
    return;
  }
  job_ = &fn;
  finished_.store(0, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock{mu_};
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (sleepers_.load() > 0)
    wake_.notify_all();
  fn(0);
  while (finished_.load(std::memory_order_acquire) != size_ - 1)
    TROUPE_PAUSE();
}

void thread_team::barrier() {
  if (size_ == 1)
    return;
  auto phase = phase_.load(std::memory_order_acquire);
  if (arrived_.fetch_add(1, std::memory_order_acq_rel) == size_ - 1) {
    arrived_.store(0, std::memory_order_relaxed);
    phase_.store(phase + 1, std::memory_order_release);
    return;
  }
  int spins = 0;
  while (phase_.load(std::memory_order_acquire) == phase)
    if (++spins < kBarrierSpins)
      TROUPE_PAUSE();
    else
      std::this_thread::yield();
}

// ---- the arithmetic ---------------------------------------------------------------

namespace {

// Lanes per accumulator: a GCC vector of 16 floats (one AVX-512 register,
// two AVX2 ones, four SSE ones in the clones below). The helpers are
// always inlined, so that each clone compiles them for its own target.
constexpr int kLanes = 16;
typedef float lanes __attribute__((vector_size(kLanes * sizeof(float))));
typedef float lanes_unaligned
    __attribute__((vector_size(kLanes * sizeof(float)), aligned(alignof(float)), may_alias));

#define TROUPE_INLINE inline __attribute__((always_inline))

TROUPE_INLINE lanes load(const float* p) {
  return *reinterpret_cast<const lanes_unaligned*>(p);
}

typedef float half_lanes __attribute__((vector_size(kLanes * sizeof(float) / 2)));
typedef float quarter_lanes __attribute__((vector_size(kLanes * sizeof(float) / 4)));

// The sum of the lanes, by halves (a tree, not 16 dependent adds).
TROUPE_INLINE float hsum(lanes v) {
  half_lanes h = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  quarter_lanes q =
      __builtin_shufflevector(h, h, 0, 1, 2, 3) + __builtin_shufflevector(h, h, 4, 5, 6, 7);
  return (q[0] + q[2]) + (q[1] + q[3]);
}

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

// W[r] · x for one row: four chains along the row, so that the loads run
// ahead of the adds, and one sequential stream (consecutive rows continue
// it), which the hardware prefetchers follow best.
TROUPE_INLINE float row_dot(const float* w, const float* x, int64_t n) {
  lanes a0{}, a1{}, a2{}, a3{};
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    a0 += load(w + i) * load(x + i);
    a1 += load(w + i + kLanes) * load(x + i + kLanes);
    a2 += load(w + i + 2 * kLanes) * load(x + i + 2 * kLanes);
    a3 += load(w + i + 3 * kLanes) * load(x + i + 3 * kLanes);
  }
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    a0 += load(w + i) * load(x + i);
    a1 += load(w + i + kLanes) * load(x + i + kLanes);
  }
  if (i + kLanes <= n) {
    a2 += load(w + i) * load(x + i);
    i += kLanes;
  }
  float s = hsum((a0 + a1) + (a2 + a3));
  for (; i < n; ++i)
    s += w[i] * x[i];
  return s;
}

// A tile: kRows weight rows against up to kTokens tokens' inputs. Each
// weight row is loaded once per tile and used for every token of it, and a
// thread's rows stay in L1 while it walks the batch's tiles, so the weights
// stream from memory once per step whatever the batch. 16 accumulators of
// 16 lanes with 8 loads: the AVX-512 register file holds them.
constexpr int kRows = 4;
constexpr int kTokens = 4;

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
  if constexpr (R * T == kLanes) {
    // Sixteen sums at once: a transposing tree of 15 vector adds instead of
    // one 16-lane reduction per output.
    lanes sums = reduce16(&acc[0][0]);
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t)
        out[r][t] = sums[kBitReversed4[r * T + t]];
  } else {
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
    // Its rows are four short streams the hardware prefetchers find late.
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

// Y[t][r] (+)= W[r] · X[t] + bias[r] for rows [r0, r1); Y is [batch, ldy].
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void
linear_rows(const float* w, const float* bias, const float* x, int64_t batch, float* y, int64_t ldy,
            int64_t r0, int64_t r1, int64_t n, bool accumulate) {
  matmul_rows(w, x, batch, r0, r1, n, [&](int64_t r, int64_t t, float v) {
    v += bias ? bias[r] : 0.0f;
    float& out = y[t * ldy + r];
    out = accumulate ? out + v : v;
  });
}

// H[t][r] = silu(W1[r] · X[t] + b1) · (W3[r] · X[t] + b3) for rows [r0, r1).
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void
swiglu_rows(const float* w1, const float* w3, const float* b1, const float* b3, const float* x,
            int64_t batch, float* h, int64_t ldh, int64_t r0, int64_t r1, int64_t n) {
  // The gate first, into H; then the up projection combines with it.
  matmul_rows(w1, x, batch, r0, r1, n,
              [&](int64_t r, int64_t t, float g) { h[t * ldh + r] = g + (b1 ? b1[r] : 0.0f); });
  matmul_rows(w3, x, batch, r0, r1, n, [&](int64_t r, int64_t t, float u) {
    float g = h[t * ldh + r];
    h[t * ldh + r] = g / (1.0f + std::exp(-g)) * (u + (b3 ? b3[r] : 0.0f));
  });
}

// out = weight ⊙ x · rsqrt(mean(x²) + eps), in fp32 (the ATen path's order).
void rms_norm(const float* x, const float* weight, float eps, int64_t n, float* out) {
  double ss = 0; // matches mean() over fp32 closely for these short rows
  for (int64_t i = 0; i < n; ++i)
    ss += static_cast<double>(x[i]) * x[i];
  auto inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i)
    out[i] = weight[i] * (x[i] * inv);
}

// Rotate-half RoPE of one head in place: for i < D/2 the pair (i, i + D/2)
// turns by the angle position · inv_freq[i], whose cos and sin are given.
void rope(float* v, const float* cos, const float* sin, int64_t head_dim) {
  auto half = head_dim / 2;
  for (int64_t i = 0; i < half; ++i) {
    float a = v[i], b = v[i + half];
    v[i] = a * cos[i] - b * sin[i];
    v[i + half] = b * cos[i] + a * sin[i];
  }
}

// Calls fn(position, row) for each of the first `context_len` positions of
// a request, row pointing at its `kv_head` in `pool` through the block table
// (a block at a time: no division per position).
template <class Fn>
TROUPE_INLINE void each_cached(const float* pool, const int32_t* block_table, int64_t block_size,
                               int64_t n_kv, int64_t kv_head, int64_t head_dim, int64_t context_len,
                               Fn&& fn) {
  const int64_t stride = n_kv * head_dim; // floats from one slot to the next
  for (int64_t p = 0, blk = 0; p < context_len; ++blk) {
    const float* row =
        pool + static_cast<int64_t>(block_table[blk]) * block_size * stride + kv_head * head_dim;
    for (int64_t end = std::min(context_len, p + block_size); p < end; ++p, row += stride)
      fn(p, row);
  }
}

// One query head over its request's cached positions: out = softmax(q·K /
// sqrt(D)) V, reading K/V rows in place through the block table.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void
attend_head(const float* q, const float* k_cache, const float* v_cache, const int32_t* block_table,
            int64_t block_size, int64_t n_kv, int64_t kv_head, int64_t head_dim,
            int64_t context_len, float* scores, float* out) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  each_cached(k_cache, block_table, block_size, n_kv, kv_head, head_dim, context_len,
              [&](int64_t p, const float* k) { scores[p] = row_dot(q, k, head_dim); });
  // The weights exp(scale · (s − max)) in place, at vector width (the
  // sampler's kernel); a NaN score leaves them unwritten: NaN out, as ATen.
  auto stats = detail::softmax_row(scores, context_len, scale, scores);
  if (stats.argmax < 0) {
    std::fill_n(out, head_dim, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  const auto sum = static_cast<float>(stats.sum);
  constexpr int64_t kMaxVectors = 16; // head_dim up to 256 in registers' worth of lanes
  if (head_dim % kLanes == 0 && head_dim / kLanes <= kMaxVectors) {
    const int64_t vectors = head_dim / kLanes;
    lanes acc[kMaxVectors] = {};
    each_cached(v_cache, block_table, block_size, n_kv, kv_head, head_dim, context_len,
                [&](int64_t p, const float* v) {
                  float w = scores[p] / sum;
                  for (int64_t j = 0; j < vectors; ++j)
                    acc[j] += w * load(v + j * kLanes);
                });
    for (int64_t j = 0; j < vectors; ++j)
      for (int l = 0; l < kLanes; ++l)
        out[j * kLanes + l] = acc[j][l];
    return;
  }
  for (int64_t d = 0; d < head_dim; ++d)
    out[d] = 0;
  each_cached(v_cache, block_table, block_size, n_kv, kv_head, head_dim, context_len,
              [&](int64_t p, const float* v) {
                float w = scores[p] / sum;
                for (int64_t d = 0; d < head_dim; ++d)
                  out[d] += w * v[d];
              });
}

// [begin, end) of member `t` of `size` over n items (contiguous, balanced;
// in whole units of `unit` but the last).
std::pair<int64_t, int64_t> share(int64_t n, int t, int size, int64_t unit = 1) {
  auto units = (n + unit - 1) / unit;
  return {std::min(n, units * t / size * unit), std::min(n, units * (t + 1) / size * unit)};
}

// The step's activations, shared by the team (each member writes only its
// own rows or items of them).
struct activations {
  std::vector<float> x, qkv, att, h;
  std::vector<float> cos, sin; // [size, head_dim / 2]: each token's RoPE angles, for every layer
  activations(const decode_model& m, const decode_batch& b, int64_t qkv_rows, int64_t q_rows)
      : x(static_cast<size_t>(b.size * m.dim)), qkv(static_cast<size_t>(b.size * qkv_rows)),
        att(static_cast<size_t>(b.size * q_rows)), h(static_cast<size_t>(b.size * m.hidden)),
        cos(static_cast<size_t>(b.size * m.head_dim / 2)),
        sin(static_cast<size_t>(b.size * m.head_dim / 2)) {
    const int64_t half = m.head_dim / 2;
    for (int64_t t = 0; t < b.size; ++t) {
      std::copy_n(m.embedding_row(b.tokens[t]), m.dim, x.data() + t * m.dim);
      for (int64_t i = 0; i < half; ++i) {
        float angle = static_cast<float>(b.positions[t]) * m.inv_freq[i];
        cos[static_cast<size_t>(t * half + i)] = std::cos(angle);
        sin[static_cast<size_t>(t * half + i)] = std::sin(angle);
      }
    }
  }
  const float* cos_of(int64_t t, int64_t head_dim) const { return cos.data() + t * (head_dim / 2); }
  const float* sin_of(int64_t t, int64_t head_dim) const { return sin.data() + t * (head_dim / 2); }
};

} // namespace

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) float
dot(const float* a, const float* b, int64_t n) {
  return row_dot(a, b, n);
}

void fused_decode(const decode_model& m, const decode_batch& b, thread_team& team) {
  const int64_t B = b.size, D = m.dim, HD = m.head_dim;
  const int64_t q_rows = m.n_heads * HD, kv_rows = m.n_kv * HD;
  const int64_t qkv_rows = q_rows + 2 * kv_rows;
  const int64_t group = m.n_heads / m.n_kv;
  int64_t max_context = 0;
  for (int64_t t = 0; t < B; ++t)
    max_context = std::max(max_context, b.context_lens[t]);
  activations a{m, b, qkv_rows, q_rows};
  team.run([&](int me) {
    const int n = team.size();
    std::vector<float> xn(static_cast<size_t>(B * D)), scores(static_cast<size_t>(max_context));
    auto normalise = [&](const float* weight) {
      for (int64_t t = 0; t < B; ++t)
        rms_norm(a.x.data() + t * D, weight, m.eps, D, xn.data() + t * D);
    };
    auto [o0, o1] = share(D, me, n, kRows);
    for (const auto& L : m.layers) {
      // q | k | v rows of the normalised residual.
      normalise(L.attn_norm);
      auto [r0, r1] = share(qkv_rows, me, n, kRows);
      auto part = [&](int64_t base, int64_t rows, const float* w, const float* bias) {
        auto lo = std::max(r0, base), hi = std::min(r1, base + rows);
        if (lo < hi)
          linear_rows(w, bias, xn.data(), B, a.qkv.data() + base, qkv_rows, lo - base, hi - base, D,
                      false);
      };
      part(0, q_rows, L.wq, L.bq);
      part(q_rows, kv_rows, L.wk, L.bk);
      part(q_rows + kv_rows, kv_rows, L.wv, L.bv);
      team.barrier();
      // RoPE of the query heads; RoPE of the key heads and the K/V write.
      const int64_t heads = m.n_heads + m.n_kv;
      auto [h0, h1] = share(B * heads, me, n);
      for (int64_t item = h0; item < h1; ++item) {
        auto t = item / heads, hd = item % heads;
        float* row = a.qkv.data() + t * qkv_rows;
        if (hd < m.n_heads) {
          rope(row + hd * HD, a.cos_of(t, HD), a.sin_of(t, HD), HD);
          continue;
        }
        auto j = hd - m.n_heads;
        float* k = row + q_rows + j * HD;
        const float* v = row + q_rows + kv_rows + j * HD;
        rope(k, a.cos_of(t, HD), a.sin_of(t, HD), HD);
        auto slot = (b.slots[t] * m.n_kv + j) * HD;
        std::copy_n(k, HD, L.k_cache + slot);
        std::copy_n(v, HD, L.v_cache + slot);
      }
      team.barrier();
      auto [a0, a1] = share(B * m.n_heads, me, n);
      for (int64_t item = a0; item < a1; ++item) {
        auto t = item / m.n_heads, hd = item % m.n_heads;
        attend_head(a.qkv.data() + t * qkv_rows + hd * HD, L.k_cache, L.v_cache,
                    b.block_tables + t * b.table_width, m.block_size, m.n_kv, hd / group, HD,
                    b.context_lens[t], scores.data(), a.att.data() + t * q_rows + hd * HD);
      }
      team.barrier();
      linear_rows(L.wo, L.bo, a.att.data(), B, a.x.data(), D, o0, o1, q_rows, true);
      team.barrier();
      normalise(L.ffn_norm);
      auto [f0, f1] = share(m.hidden, me, n, kRows);
      swiglu_rows(L.w1, L.w3, L.b1, L.b3, xn.data(), B, a.h.data(), m.hidden, f0, f1, D);
      team.barrier();
      linear_rows(L.w2, L.b2, a.h.data(), B, a.x.data(), D, o0, o1, m.hidden, true);
      team.barrier();
    }
    normalise(m.final_norm);
    auto [v0, v1] = share(m.vocab, me, n, kRows);
    linear_rows(m.lm_head, nullptr, xn.data(), B, b.logits, m.vocab, v0, v1, D, false);
  });
}

} // namespace troupe::kernels::cpu
