// The batch-invariant kernels (NOTE [batch-invariant kernels] in
// kernels/cpu/invariant.hpp), compiled once per instruction set. Not a header
// to include anywhere else: kernels/cpu/invariant_avx2.cpp and
// invariant_baseline.cpp include it under their target pragma with
//   TROUPE_INVARIANT_TABLE  the table's name in invariant_tables
//   TROUPE_INVARIANT_FMA    1 when the path fuses multiply-adds
// defined. The files are built with -ffp-contract=off: the only fused
// multiply-adds are the ones written here, so a vector lane and a scalar
// tail compute the same thing wherever the compiler splits a loop.

#pragma GCC diagnostic ignored "-Wpsabi"

namespace troupe::kernels::cpu {

namespace {

#define TROUPE_INLINE inline __attribute__((always_inline))

typedef float lanes __attribute__((vector_size(8 * sizeof(float))));
typedef float lanes_unaligned
    __attribute__((vector_size(8 * sizeof(float)), aligned(alignof(float)), may_alias));
constexpr int64_t kLanes = 8;

TROUPE_INLINE lanes load(const float* p) {
  return *reinterpret_cast<const lanes_unaligned*>(p);
}

#if TROUPE_INVARIANT_FMA
TROUPE_INLINE lanes madd(lanes a, lanes b, lanes c) {
  return _mm256_fmadd_ps(a, b, c);
}
TROUPE_INLINE float madd(float a, float b, float c) {
  return __builtin_fmaf(a, b, c);
}
#else
TROUPE_INLINE lanes madd(lanes a, lanes b, lanes c) {
  return a * b + c;
}
TROUPE_INLINE float madd(float a, float b, float c) {
  return a * b + c;
}
#endif

// ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
TROUPE_INLINE float hsum(lanes v) {
  typedef float four __attribute__((vector_size(4 * sizeof(float))));
  four q = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
  return (q[0] + q[2]) + (q[1] + q[3]);
}

// out[r][c] = X[r] · W[c] for R rows of X and C rows of W, each in the order
// of the note: the tiles only share loads.
template <int R, int C>
TROUPE_INLINE void tile(const float* x, int64_t ldx, const float* w, int64_t n,
                        float (&out)[4][3]) {
  lanes acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      acc[r][c] = lanes{};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    lanes wv[C];
    for (int c = 0; c < C; ++c)
      wv[c] = load(w + c * n + k);
    for (int r = 0; r < R; ++r) {
      lanes xv = load(x + r * ldx + k);
      for (int c = 0; c < C; ++c)
        acc[r][c] = madd(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = hsum(acc[r][c]);
      for (int64_t j = k; j < n; ++j)
        s = madd(x[r * ldx + j], w[c * n + j], s);
      out[r][c] = s;
    }
}

template <int R>
TROUPE_INLINE void tile_outputs(int outputs, const float* x, int64_t ldx, const float* w, int64_t n,
                                float (&out)[4][3]) {
  switch (outputs) {
  case 3:
    return tile<R, 3>(x, ldx, w, n, out);
  case 2:
    return tile<R, 2>(x, ldx, w, n, out);
  default:
    return tile<R, 1>(x, ldx, w, n, out);
  }
}

void any_tile(int rows, int outputs, const float* x, int64_t ldx, const float* w, int64_t n,
              float (&out)[4][3]) {
  switch (rows) {
  case 4:
    return tile_outputs<4>(outputs, x, ldx, w, n, out);
  case 3:
    return tile_outputs<3>(outputs, x, ldx, w, n, out);
  case 2:
    return tile_outputs<2>(outputs, x, ldx, w, n, out);
  default:
    return tile_outputs<1>(outputs, x, ldx, w, n, out);
  }
}

float dot(const float* a, const float* b, int64_t n) {
  float out[4][3];
  tile<1, 1>(a, n, b, n, out);
  return out[0][0];
}

void linear(const float* x, int64_t ldx, int64_t rows, int64_t n, const float* w, const float* bias,
            float* y, int64_t ldy, int64_t o0, int64_t o1) {
  constexpr int64_t kRowBlock = 64; // rows whose inputs stay in cache while W streams by
  for (int64_t t0 = 0; t0 < rows; t0 += kRowBlock) {
    const int64_t t1 = std::min(rows, t0 + kRowBlock);
    for (int64_t o = o0; o < o1; o += 3) {
      const int outputs = static_cast<int>(std::min<int64_t>(3, o1 - o));
      for (int64_t t = t0; t < t1; t += 4) {
        const int tr = static_cast<int>(std::min<int64_t>(4, t1 - t));
        float out[4][3];
        any_tile(tr, outputs, x + t * ldx, ldx, w + o * n, n, out);
        for (int r = 0; r < tr; ++r)
          for (int c = 0; c < outputs; ++c)
            y[(t + r) * ldy + o + c] = bias != nullptr ? out[r][c] + bias[o + c] : out[r][c];
      }
    }
  }
}

void rms_norm(const float* x, int64_t n, const float* weight, float eps, float* y) {
  const float mean = dot(x, x, n) / static_cast<float>(n);
  const float r = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i)
    y[i] = (x[i] * r) * weight[i];
}

void attend(const float* q, int64_t d, const float* k, const float* v, int64_t stride,
            const int64_t* slots, int64_t keys, float scale, float* scores, float* out) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < keys; ++j) {
    scores[j] = dot(q, k + slots[j] * stride, d) * scale;
    m = scores[j] > m ? scores[j] : m;
  }
  for (int64_t j = 0; j < keys; ++j)
    scores[j] = detail::exp_nonpositive(scores[j] - m);
  float sum = 0;
  for (int64_t j = 0; j < keys; ++j)
    sum += scores[j];
  for (int64_t i = 0; i < d; ++i)
    out[i] = 0;
  for (int64_t j = 0; j < keys; ++j) {
    const float p = scores[j];
    const float* vj = v + slots[j] * stride;
    for (int64_t i = 0; i < d; ++i)
      out[i] += p * vj[i];
  }
  for (int64_t i = 0; i < d; ++i)
    out[i] /= sum;
}

void swiglu(const float* a, const float* b, int64_t n, float* h) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = a[i];
    const float e = detail::exp_nonpositive(x < 0 ? x : -x); // exp(-|x|)
    const float sigmoid = x < 0 ? e / (1.0f + e) : 1.0f / (1.0f + e);
    h[i] = (x * sigmoid) * b[i];
  }
}

void rope(float* x, int64_t d, const float* cos, const float* sin) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[i + half];
    x[i] = x1 * cos[i] - x2 * sin[i];
    x[i + half] = x2 * cos[i] + x1 * sin[i];
  }
}

#undef TROUPE_INLINE

} // namespace

namespace invariant_tables {

const invariant_kernels TROUPE_INVARIANT_TABLE = {
    TROUPE_INVARIANT_NAME, linear, rms_norm, attend, swiglu, rope,
};

} // namespace invariant_tables

} // namespace troupe::kernels::cpu
