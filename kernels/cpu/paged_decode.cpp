#include "kernels/cpu/paged_decode.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace troupe::kernels::detail {

namespace {

// Eight independent partial sums: a single accumulator is a serial chain of
// dependent adds (the compiler may not reorder float sums) and ran ~4x slower.
template <class T>
T dot(const T* a, const T* b, int64_t n) {
  T part[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j)
      part[j] += a[i + j] * b[i + j];
  T total = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
  for (; i < n; ++i)
    total += a[i] * b[i];
  return total;
}

template <class T>
void axpy(T alpha, const T* x, T* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    y[i] += alpha * x[i];
}

// K/V rows come from DRAM (the weights streamed in between evict them), and a
// block boundary breaks the hardware prefetcher's stride: ask two rows ahead.
template <class T>
void prefetch_row(const T* p, int64_t n) {
  const char* c = reinterpret_cast<const char*>(p);
  for (int64_t b = 0; b < n * static_cast<int64_t>(sizeof(T)); b += 64)
    __builtin_prefetch(c + b);
}

} // namespace

template <class T>
void paged_decode_items(const T* q, const T* k_pool, const T* v_pool, T* out,
                        const int64_t* tables, const int64_t* context_lens,
                        const paged_decode_shape& shape, T scale, int64_t begin, int64_t end) {
  const int64_t H = shape.heads, n_kv = shape.kv_heads, D = shape.head_dim;
  const int64_t bs = shape.block_size, G = H / n_kv;
  const int64_t slot_stride = n_kv * D; // a slot's K (or V) row: every kv head, contiguous
  std::vector<T> scores;
  for (int64_t r = begin; r < end; ++r) {
    const int64_t L = context_lens[r];
    const int64_t* table = tables + r * shape.max_blocks;
    const T* qr = q + r * H * D;
    T* o = out + r * H * D;
    // Slots are visited in order, so each block's rows stream contiguously.
    auto row = [&](const T* pool, int64_t pos) {
      return pool + (table[pos / bs] * bs + pos % bs) * slot_stride;
    };
    scores.resize(static_cast<size_t>(H * L));
    for (int64_t pos = 0; pos < L; ++pos) {
      const T* k = row(k_pool, pos);
      if (pos + 2 < L)
        prefetch_row(row(k_pool, pos + 2), slot_stride);
      for (int64_t h = 0; h < H; ++h)
        scores[h * L + pos] = dot(qr + h * D, k + (h / G) * D, D) * scale;
    }
    for (int64_t h = 0; h < H; ++h) {
      T* s = scores.data() + h * L;
      const T peak = *std::max_element(s, s + L);
      T total = 0;
      for (int64_t pos = 0; pos < L; ++pos)
        total += (s[pos] = std::exp(s[pos] - peak));
      const T inv = T{1} / total;
      for (int64_t pos = 0; pos < L; ++pos)
        s[pos] *= inv;
    }
    std::fill(o, o + H * D, T{0});
    for (int64_t pos = 0; pos < L; ++pos) {
      const T* v = row(v_pool, pos);
      if (pos + 2 < L)
        prefetch_row(row(v_pool, pos + 2), slot_stride);
      for (int64_t h = 0; h < H; ++h)
        axpy(scores[h * L + pos], v + (h / G) * D, o + h * D, D);
    }
  }
}

template void paged_decode_items<float>(const float*, const float*, const float*, float*,
                                        const int64_t*, const int64_t*, const paged_decode_shape&,
                                        float, int64_t, int64_t);
template void paged_decode_items<double>(const double*, const double*, const double*, double*,
                                         const int64_t*, const int64_t*, const paged_decode_shape&,
                                         double, int64_t, int64_t);

} // namespace troupe::kernels::detail
