#pragma once
// The fused decode's vector helpers (kernels/cpu/fused_decode.cpp and
// kernels/cpu/decode_panels.cpp; private to kernels/cpu).

// The 64-byte vector helpers below are always inlined: no call passes one,
// so the ABI note GCC gives for them does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

#include <cstdint>

namespace troupe::kernels::cpu::decode_impl {

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

TROUPE_INLINE void store(float* p, lanes v) {
  *reinterpret_cast<lanes_unaligned*>(p) = v;
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

} // namespace troupe::kernels::cpu::decode_impl
