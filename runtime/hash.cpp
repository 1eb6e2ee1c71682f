#include "runtime/hash.hpp"

#include <bit>
#include <cstring>

namespace troupe::runtime {

namespace {

// Odd 64-bit constants with well-spread bits.
constexpr uint64_t M0 = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t M1 = 0xD6E8FEB86659FD93ULL;
constexpr uint64_t M2 = 0xA0761D6478BD642FULL;

inline uint64_t load64(const unsigned char* p) noexcept {
  uint64_t w;
  std::memcpy(&w, p, 8);
  if constexpr (std::endian::native == std::endian::big)
    w = __builtin_bswap64(w);
  return w;
}

// One multiply per word: each step is a bijection of the lane for a fixed
// word and of the word for a fixed lane, so no single-word change cancels.
inline uint64_t absorb(uint64_t lane, uint64_t word) noexcept {
  return std::rotl(lane + word, 29) * M0;
}

inline uint64_t avalanche(uint64_t h) noexcept {
  h ^= h >> 32;
  h *= M1;
  h ^= h >> 29;
  h *= M2;
  h ^= h >> 32;
  return h;
}

struct lanes {
  uint64_t a, b, c, d;
  explicit lanes(uint64_t seed) noexcept
    : a(seed + M0), b(seed ^ M1), c(seed + M2), d(seed - M0) {}
  inline void stripe(const unsigned char* p) noexcept {
    a = absorb(a, load64(p));
    b = absorb(b, load64(p + 8));
    c = absorb(c, load64(p + 16));
    d = absorb(d, load64(p + 24));
  }
};

uint64_t finish(const lanes& l, const unsigned char* tail, size_t tail_n, size_t n) noexcept {
  uint64_t h = std::rotl(l.a, 1) + std::rotl(l.b, 13) + std::rotl(l.c, 27) + std::rotl(l.d, 41);
  h = absorb(h ^ static_cast<uint64_t>(n), M2);
  size_t i = 0;
  for (; i + 8 <= tail_n; i += 8)
    h = absorb(h, load64(tail + i));
  for (; i < tail_n; ++i)
    h = absorb(h, uint64_t{tail[i]} | 0x100ULL);
  return avalanche(h);
}

} // namespace

uint64_t hash64(const void* data, size_t n, uint64_t seed) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  lanes l{seed};
  size_t stripes = n / 32;
  for (size_t s = 0; s < stripes; ++s)
    l.stripe(p + s * 32);
  return finish(l, p + stripes * 32, n - stripes * 32, n);
}

uint64_t hash64_copy(void* dst, const void* src, size_t n, uint64_t seed) noexcept {
  // Each stripe is loaded once, stored, and absorbed from the registers.
  const auto* s = static_cast<const unsigned char*>(src);
  auto* d = static_cast<unsigned char*>(dst);
  lanes l{seed};
  size_t stripes = n / 32;
  for (size_t k = 0; k < stripes; ++k) {
    uint64_t w[4];
    std::memcpy(w, s + k * 32, 32);
    std::memcpy(d + k * 32, w, 32);
    if constexpr (std::endian::native == std::endian::big)
      for (auto& x : w)
        x = __builtin_bswap64(x);
    l.a = absorb(l.a, w[0]);
    l.b = absorb(l.b, w[1]);
    l.c = absorb(l.c, w[2]);
    l.d = absorb(l.d, w[3]);
  }
  size_t body = stripes * 32;
  std::memcpy(d + body, s + body, n - body);
  return finish(l, d + body, n - body, n);
}

std::string hex64(uint64_t h) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, h >>= 4)
    out[static_cast<size_t>(i)] = digits[h & 0xF];
  return out;
}

bool parse_hex64(const std::string& s, uint64_t& out) noexcept {
  if (s.size() != 16)
    return false;
  uint64_t v = 0;
  for (char ch : s) {
    int d;
    if (ch >= '0' && ch <= '9')
      d = ch - '0';
    else if (ch >= 'a' && ch <= 'f')
      d = ch - 'a' + 10;
    else if (ch >= 'A' && ch <= 'F')
      d = ch - 'A' + 10;
    else
      return false;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  out = v;
  return true;
}

} // namespace troupe::runtime
