#pragma once
// Deterministic randomness that is the same on every machine and library
// version: splitmix64 steps, seed mixing, and permutations built from them
// (no std distributions, whose output is implementation-defined). Used
// wherever a random choice must be a pure function of a seed (data order,
// minibatch shuffles, task examples, sample streams).

#include <cstdint>
#include <initializer_list>
#include <numeric>
#include <utility>
#include <vector>

namespace troupe::runtime {

/// One step of splitmix64: advances `state` and returns the next output.
inline uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// A 64-bit seed from several integers (run seed, stream, iteration, index).
inline uint64_t mix_seed(std::initializer_list<uint64_t> parts) {
  uint64_t state = 0x5eedULL;
  uint64_t out = 0;
  for (auto p : parts) {
    state ^= p;
    out = splitmix64(state);
  }
  return out;
}

/// A permutation of [0, n) drawn from `seed` (Fisher–Yates over splitmix64).
inline std::vector<int64_t> seeded_permutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> p(static_cast<size_t>(n < 0 ? 0 : n));
  std::iota(p.begin(), p.end(), int64_t{0});
  uint64_t state = seed;
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(splitmix64(state) % static_cast<uint64_t>(i + 1));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

} // namespace troupe::runtime
