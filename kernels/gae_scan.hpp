#pragma once
// The GAE backward scan over one sequence, shared by the CPU reference
// (kernels/gae.cpp) and the CUDA kernel (kernels/cuda/gae.cu). See NOTE
// [masked scans] in kernels/gae.hpp. Header-only, no LibTorch.

#include <cstdint>

#if defined(__CUDACC__)
#define TROUPE_HOST_DEVICE __host__ __device__
#else
#define TROUPE_HOST_DEVICE
#endif

namespace troupe::kernels::detail {

/// Scans row `b` of [batch, steps] arrays backwards: masked positions get 0
/// and are skipped (the next value of a valid token is the next VALID token's
/// value; 0 after the last). `values` may be null (discounted returns).
template <class T, class M>
TROUPE_HOST_DEVICE inline void gae_scan_row(const T* rewards, const T* values, const M* mask,
                                            int64_t b, int64_t steps, T gamma, T lambda,
                                            T* advantages, T* returns) {
  const T decay = gamma * lambda;
  T next_value = 0;
  T carry = 0;
  const int64_t row = b * steps;
  for (int64_t t = steps - 1; t >= 0; --t) {
    const int64_t i = row + t;
    if (!mask[i]) {
      advantages[i] = 0;
      returns[i] = 0;
      continue;
    }
    const T value = values ? values[i] : T{0};
    carry = rewards[i] + gamma * next_value - value + decay * carry;
    advantages[i] = carry;
    returns[i] = carry + value;
    next_value = value;
  }
}

} // namespace troupe::kernels::detail
