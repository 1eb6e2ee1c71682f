#include "kernels/cpu/softmax_row.hpp"

#include <cmath>
#include <limits>

namespace troupe::kernels::detail {

namespace {

// Lanes per block: the loops below are straight-line over a block, which GCC
// turns into vector code without -ffast-math (a running `m = max(m, x)` or
// `s += x` is a serial chain it may not reorder).
constexpr int kLanes = 16;

} // namespace

__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default"))) softmax_row_stats
softmax_row(const float* x, int64_t n, float scale, float* weights) {
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
  // The lowest index of the max (what a first-wins scan gives): a block at
  // a time at vector width, then the element within the first block that
  // holds it (an element-wise scan with an early exit stays scalar).
  int64_t from = 0;
  for (; from + kLanes <= n; from += kLanes) {
    int32_t hits = 0;
    for (int l = 0; l < kLanes; ++l)
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
