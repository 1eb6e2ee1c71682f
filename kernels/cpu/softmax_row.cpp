#include "kernels/cpu/softmax_row.hpp"

#include <cmath>
#include <cstring>
#include <limits>

namespace troupe::kernels::detail {

namespace {

// Lanes per block: the loops below are straight-line over a block, which GCC
// turns into vector code without -ffast-math (a running `m = max(m, x)` or
// `s += x` is a serial chain it may not reorder).
constexpr int kLanes = 16;

// exp(y) for y <= 0, branch-free so a block vectorises. y = n·ln2 + r with
// |r| <= ln2/2; exp(r) by the classic single-precision polynomial (Cephes'
// expf coefficients); 2^n built in the exponent bits. Below -87.3 (2^-126,
// the smallest normal float) the result is 0, as is exp(-inf).
inline float exp_nonpositive(float y) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRound = 12582912.0f; // 1.5 · 2^23: adding it rounds to an integer
  bool underflow = !(y > -87.3f);       // also NaN-safe: the caller rejects NaN rows
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

} // namespace

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
softmax_row_stats softmax_row(const float* x, int64_t n, float scale, float* weights) {
  softmax_row_stats s;
  // Pass 1: max and a NaN count.
  float lane_max[kLanes];
  int32_t lane_nan[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    lane_max[l] = -std::numeric_limits<float>::infinity();
    lane_nan[l] = 0;
  }
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      float v = x[i + l];
      lane_max[l] = v > lane_max[l] ? v : lane_max[l];
      lane_nan[l] += v != v;
    }
  float m = -std::numeric_limits<float>::infinity();
  int32_t nans = 0;
  for (int l = 0; l < kLanes; ++l) {
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
  // The lowest index of the max (what a first-wins scan gives).
  for (int64_t v = 0; v < n; ++v)
    if (x[v] == m) {
      s.argmax = v;
      break;
    }
  // Pass 2: Σ exp(scale · (x − max)), in double lanes.
  double lane_sum[kLanes] = {};
  float e[kLanes];
  i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l)
      e[l] = exp_nonpositive(scale * (x[i + l] - m));
    for (int l = 0; l < kLanes; ++l)
      lane_sum[l] += static_cast<double>(e[l]);
    if (weights != nullptr)
      std::memcpy(weights + i, e, sizeof e);
  }
  double total = 0;
  for (int l = 0; l < kLanes; ++l)
    total += lane_sum[l];
  for (; i < n; ++i) {
    float w = exp_nonpositive(scale * (x[i] - m));
    total += static_cast<double>(w);
    if (weights != nullptr)
      weights[i] = w;
  }
  s.sum = total;
  return s;
}

double softmax_row_logprob(const softmax_row_stats& s, float x_v, float scale) {
  return static_cast<double>(scale) * (static_cast<double>(x_v) - static_cast<double>(s.max)) -
         std::log(s.sum);
}

} // namespace troupe::kernels::detail
