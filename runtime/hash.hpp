#pragma once
// A fast non-cryptographic 64-bit hash for integrity checks of large buffers
// (weight transfers, where FNV-1a's byte-at-a-time loop would cost more than
// the copy it protects).
//
// NOTE [hash64]: the input is read as little-endian 64-bit words in stripes of
// four; each of four lanes absorbs its word as
//     lane = rotl(lane + word, 29) * M0
// so the lanes are independent chains the CPU runs in parallel. The lanes are
// then folded together with the length and the tail (remaining words, then
// bytes), and the result goes through a final avalanche (xor-shift and
// multiply rounds). It detects any change of a single bit, byte or word,
// swapped stripes and truncation, which is what a transfer check needs; it
// is not meant to resist an adversary.

#include <cstddef>
#include <cstdint>
#include <string>

namespace troupe::runtime {

/// Hash of `n` bytes at `data`.
uint64_t hash64(const void* data, size_t n, uint64_t seed = 0) noexcept;

/// Copies `n` bytes from `src` to `dst` (not overlapping) and returns
/// hash64(src, n, seed), reading the source once.
uint64_t hash64_copy(void* dst, const void* src, size_t n, uint64_t seed = 0) noexcept;

/// 16 lowercase hex digits.
std::string hex64(uint64_t h);

/// Parses 16 hex digits; false when `s` is not exactly that.
bool parse_hex64(const std::string& s, uint64_t& out) noexcept;

} // namespace troupe::runtime
