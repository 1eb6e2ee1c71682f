#pragma once
// CPU paged decode attention over raw pointers (no LibTorch): the CPU
// counterpart of kernels/cuda/paged_attention.cu. kernels/paged_attention.cpp
// validates the step and splits the work items over ATen's thread pool. This
// file is compiled with -O3 so the inner loops vectorise.

#include <cstdint>

namespace troupe::kernels::detail {

/// One decode step's shapes (NOTE [paged KV layout]): q [R, H, D], pools
/// [num_blocks, block_size, n_kv, D] contiguous, tables [R, max_blocks] int64,
/// context_lens [R] int64 (each >= 1, blocks already validated).
struct paged_decode_shape {
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 0;
  int64_t max_blocks = 0;
};

/// Requests [begin, end) of R: each reads its K/V slot rows (all kv heads,
/// contiguous) in place through its block table, in position order, once for
/// all H query heads, and writes out [r, H, D].
template <class T>
void paged_decode_items(const T* q, const T* k_pool, const T* v_pool, T* out,
                        const int64_t* tables, const int64_t* context_lens,
                        const paged_decode_shape& shape, T scale, int64_t begin, int64_t end);

extern template void paged_decode_items<float>(const float*, const float*, const float*, float*,
                                               const int64_t*, const int64_t*,
                                               const paged_decode_shape&, float, int64_t, int64_t);
extern template void paged_decode_items<double>(const double*, const double*, const double*,
                                                double*, const int64_t*, const int64_t*,
                                                const paged_decode_shape&, double, int64_t,
                                                int64_t);

} // namespace troupe::kernels::detail
