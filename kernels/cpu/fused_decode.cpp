#include "kernels/cpu/fused_decode.hpp"

#include "kernels/cpu/decode_lanes.hpp"
#include "kernels/cpu/decode_panels.hpp"
#include "kernels/cpu/softmax_row.hpp"

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

using namespace decode_impl;

namespace {

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

// out = weight ⊙ x · rsqrt(mean(x²) + eps), in fp32 (the ATen path's order);
// `out` strided by `stride` (1: a row; the batch: k-major).
void rms_norm(const float* x, const float* weight, float eps, int64_t n, float* out,
              int64_t stride) {
  double ss = 0; // matches mean() over fp32 closely for these short rows
  for (int64_t i = 0; i < n; ++i)
    ss += static_cast<double>(x[i]) * x[i];
  auto inv = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (int64_t i = 0; i < n; ++i)
    out[i * stride] = weight[i] * (x[i] * inv);
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

// Attention of one request's query heads that read KV heads [j0, j1):
// out[h] = softmax(q[h] · K / sqrt(D)) V for each such head h, reading the
// K/V rows in place through the block table, a position at a time: a
// position's rows of these KV heads are adjacent in the pools, so each pass
// over K or V is one sequential stream (a head at a time, it was a stride
// the prefetchers follow poorly), and each K/V row is read once for its
// whole group of query heads. q and out are the request's rows of every
// head [n_heads · D]; scores holds (j1 − j0) · group · context_len floats,
// inv_sum (j1 − j0) · group.
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) void
attend_heads(const float* q, const float* k_cache, const float* v_cache, const int32_t* block_table,
             int64_t block_size, int64_t n_kv, int64_t group, int64_t j0, int64_t j1,
             int64_t head_dim, int64_t context_len, float* scores, float* inv_sum, float* out) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  const int64_t h0 = j0 * group, heads = (j1 - j0) * group;
  auto score = [&](int64_t h) { return scores + (h - h0) * context_len; };
  each_cached(k_cache, block_table, block_size, n_kv, j0, head_dim, context_len,
              [&](int64_t p, const float* k) {
                for (int64_t h = h0; h < h0 + heads; ++h)
                  score(h)[p] =
                      row_dot(q + h * head_dim, k + (h / group - j0) * head_dim, head_dim);
              });
  // The weights exp(scale · (s − max)) in place, at vector width (the
  // sampler's kernel), and 1 / their sum; a NaN score makes its head's
  // output NaN, as ATen (marked by a negative inv_sum).
  for (int64_t h = h0; h < h0 + heads; ++h) {
    auto stats = detail::softmax_row(score(h), context_len, scale, score(h));
    inv_sum[h - h0] = stats.argmax < 0 ? -1.0f : static_cast<float>(1.0 / stats.sum);
    std::fill_n(out + h * head_dim, head_dim, 0.0f);
  }
  const bool vectors = head_dim % kLanes == 0;
  each_cached(v_cache, block_table, block_size, n_kv, j0, head_dim, context_len,
              [&](int64_t p, const float* v) {
                for (int64_t h = h0; h < h0 + heads; ++h) {
                  const float w = inv_sum[h - h0] < 0 ? 0.0f : score(h)[p] * inv_sum[h - h0];
                  const float* vh = v + (h / group - j0) * head_dim;
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
    if (inv_sum[h - h0] < 0)
      std::fill_n(out + h * head_dim, head_dim, std::numeric_limits<float>::quiet_NaN());
}

// [begin, end) of member `t` of `size` over n items (contiguous, balanced;
// in whole units of `unit` but the last).
std::pair<int64_t, int64_t> share(int64_t n, int t, int size, int64_t unit = 1) {
  auto units = (n + unit - 1) / unit;
  return {std::min(n, units * t / size * unit), std::min(n, units * (t + 1) / size * unit)};
}

// The step's activations, shared by the team (each member writes only its
// own rows or items of them). The projections' inputs (the normalised
// residual, the attention output, the FFN's hidden rows) are token rows for
// the stored weights and k-major for the panels (NOTE [packed panels]).
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

// One decode step, run by every member of the team: each method is the
// member's share of one stage, and the stages are separated by barriers.
class step {
public:
  step(const decode_model& m, const decode_batch& b, int me, int members, activations& a)
      : m_(m), b_(b), a_(a), me_(me), n_(members), B_(b.size), D_(m.dim), HD_(m.head_dim),
        q_rows_(m.n_heads * HD_), kv_rows_(m.n_kv * HD_), qkv_rows_(q_rows_ + 2 * kv_rows_),
        packed_(m.packed() && B_ > 1), xn_(static_cast<size_t>(B_ * D_)),
        head_out_(static_cast<size_t>(q_rows_)), inv_sum_(static_cast<size_t>(m.n_heads)) {
    int64_t max_context = 0;
    for (int64_t t = 0; t < B_; ++t)
      max_context = std::max(max_context, b.context_lens[t]);
    scores_.resize(static_cast<size_t>(m.n_heads * max_context));
  }

  // The member's own copy of the normalised residual, laid out for the
  // projections (no barrier: every member computes all of it).
  void normalise(const float* weight) {
    for (int64_t t = 0; t < B_; ++t)
      rms_norm(a_.x.data() + t * D_, weight, m_.eps, D_, xn_.data() + at(t, 0, D_), at(0, 1, D_));
  }

  // q | k | v rows of the normalised residual.
  void project_qkv(const decode_layer& L) {
    if (packed_) {
      auto [p0, p1] = panels_of(qkv_rows_);
      qkv_panels(L.panels.qkv, {L.bq, L.bk, L.bv, q_rows_, kv_rows_}, xn_.data(), B_, a_.qkv.data(),
                 p0, p1, D_);
      return;
    }
    auto [r0, r1] = share(qkv_rows_, me_, n_, kRows);
    auto part = [&](int64_t base, int64_t rows, const float* w, const float* bias) {
      auto lo = std::max(r0, base), hi = std::min(r1, base + rows);
      if (lo < hi)
        linear_rows(w, bias, xn_.data(), B_, a_.qkv.data() + base, qkv_rows_, lo - base, hi - base,
                    D_, false);
    };
    part(0, q_rows_, L.wq, L.bq);
    part(q_rows_, kv_rows_, L.wk, L.bk);
    part(q_rows_ + kv_rows_, kv_rows_, L.wv, L.bv);
  }

  // RoPE of the query heads; RoPE of the key heads and the K/V write.
  void rope_and_store(const decode_layer& L) {
    const int64_t heads = m_.n_heads + m_.n_kv;
    auto [h0, h1] = share(B_ * heads, me_, n_);
    for (int64_t item = h0; item < h1; ++item) {
      auto t = item / heads, hd = item % heads;
      float* row = a_.qkv.data() + t * qkv_rows_;
      if (hd < m_.n_heads) {
        rope(row + hd * HD_, a_.cos_of(t, HD_), a_.sin_of(t, HD_), HD_);
        continue;
      }
      auto j = hd - m_.n_heads;
      float* k = row + q_rows_ + j * HD_;
      const float* v = row + q_rows_ + kv_rows_ + j * HD_;
      rope(k, a_.cos_of(t, HD_), a_.sin_of(t, HD_), HD_);
      auto slot = (b_.slots[t] * m_.n_kv + j) * HD_;
      std::copy_n(k, HD_, L.k_cache + slot);
      std::copy_n(v, HD_, L.v_cache + slot);
    }
  }

  // Attention by request, or by (request, range of KV heads) when the
  // requests are fewer than the members.
  void attend(const decode_layer& L) {
    const int64_t group = m_.n_heads / m_.n_kv;
    const int64_t parts = std::min<int64_t>(m_.n_kv, (n_ + B_ - 1) / B_);
    auto [i0, i1] = share(B_ * parts, me_, n_);
    for (int64_t item = i0; item < i1; ++item) {
      auto t = item / parts;
      auto [j0, j1] = share(m_.n_kv, static_cast<int>(item % parts), static_cast<int>(parts));
      float* out = packed_ ? head_out_.data() : a_.att.data() + t * q_rows_;
      attend_heads(a_.qkv.data() + t * qkv_rows_, L.k_cache, L.v_cache,
                   b_.block_tables + t * b_.table_width, m_.block_size, m_.n_kv, group, j0, j1, HD_,
                   b_.context_lens[t], scores_.data(), inv_sum_.data(), out);
      if (packed_)
        for (int64_t d = j0 * group * HD_; d < j1 * group * HD_; ++d)
          a_.att[static_cast<size_t>(at(t, d, q_rows_))] = out[d];
    }
  }

  // x += Wo · attention (+ bo).
  void project_out(const decode_layer& L) {
    residual(L.wo, L.panels.wo, L.bo, a_.att.data(), q_rows_);
  }

  // The FFN's hidden rows: silu(W1 · xn) ⊙ (W3 · xn).
  void gate_up(const decode_layer& L) {
    if (packed_) {
      auto [p0, p1] = panels_of(2 * m_.hidden);
      swiglu_panels(L.panels.w13, m_.hidden, L.b1, L.b3, xn_.data(), B_, a_.h.data(), p0, p1, D_);
      return;
    }
    auto [f0, f1] = share(m_.hidden, me_, n_, kRows);
    swiglu_rows(L.w1, L.w3, L.b1, L.b3, xn_.data(), B_, a_.h.data(), m_.hidden, f0, f1, D_);
  }

  // x += W2 · h (+ b2).
  void project_down(const decode_layer& L) {
    residual(L.w2, L.panels.w2, L.b2, a_.h.data(), m_.hidden);
  }

  void lm_head() {
    if (packed_) {
      auto [p0, p1] = panels_of(m_.vocab);
      linear_panels(m_.lm_head_panels, m_.vocab, nullptr, xn_.data(), B_, b_.logits, m_.vocab, p0,
                    p1, D_, false);
      return;
    }
    auto [v0, v1] = share(m_.vocab, me_, n_, kRows);
    linear_rows(m_.lm_head, nullptr, xn_.data(), B_, b_.logits, m_.vocab, v0, v1, D_, false);
  }

private:
  // Where token t's element i of an input of n elements lives.
  int64_t at(int64_t t, int64_t i, int64_t n) const { return packed_ ? i * B_ + t : t * n + i; }

  // The member's panels of a packed matrix with `rows` rows.
  std::pair<int64_t, int64_t> panels_of(int64_t rows) const {
    return share((rows + kPanelRows - 1) / kPanelRows, me_, n_);
  }

  // The member's rows of x [B, dim] += W · in + bias.
  void residual(const float* rows, const float* panels, const float* bias, const float* in,
                int64_t n) {
    if (packed_) {
      auto [p0, p1] = panels_of(D_);
      linear_panels(panels, D_, bias, in, B_, a_.x.data(), D_, p0, p1, n, true);
      return;
    }
    auto [o0, o1] = share(D_, me_, n_, kRows);
    linear_rows(rows, bias, in, B_, a_.x.data(), D_, o0, o1, n, true);
  }

  const decode_model& m_;
  const decode_batch& b_;
  activations& a_;
  const int me_, n_;
  const int64_t B_, D_, HD_, q_rows_, kv_rows_, qkv_rows_;
  const bool packed_;
  std::vector<float> xn_, head_out_, inv_sum_, scores_;
};

} // namespace

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) float
dot(const float* a, const float* b, int64_t n) {
  return row_dot(a, b, n);
}

void fused_decode(const decode_model& m, const decode_batch& b, thread_team& team) {
  const int64_t q_rows = m.n_heads * m.head_dim;
  activations a{m, b, q_rows + 2 * m.n_kv * m.head_dim, q_rows};
  team.run([&](int me) {
    step s{m, b, me, team.size(), a};
    for (const auto& L : m.layers) {
      s.normalise(L.attn_norm);
      s.project_qkv(L);
      team.barrier();
      s.rope_and_store(L);
      team.barrier();
      s.attend(L);
      team.barrier();
      s.project_out(L);
      team.barrier();
      s.normalise(L.ffn_norm);
      s.gate_up(L);
      team.barrier();
      s.project_down(L);
      team.barrier();
    }
    s.normalise(m.final_norm);
    s.lm_head();
  });
}

} // namespace troupe::kernels::cpu
