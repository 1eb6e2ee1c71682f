/* The read half of bench_decode's memory limit (issue 28): `threads`
 * OpenMP threads each read their share of a buffer as `streams` interleaved
 * sequential streams, with or without a software prefetch ahead of each,
 * summing what they read so the loads stay. Built like the naive decoder (-Ofast
 * -march=native -fopenmp). */
#include "stream_read.h"

#include <omp.h>

double stream_read_gbps(const float* p, size_t n, int threads, int streams, int prefetch) {
  double sum = 0;
  double t0 = omp_get_wtime();
#pragma omp parallel num_threads(threads) reduction(+ : sum)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    const size_t share = n / (size_t)nt, part = share / (size_t)streams / 64 * 64;
    const float* base = p + share * (size_t)t;
    float acc[16] = {0};
    for (size_t i = 0; i < part; i += 64)
      for (int s = 0; s < streams; ++s) {
        const float* q = base + (size_t)s * part + i;
        if (prefetch)
          for (int j = 0; j < 64; j += 16)
            __builtin_prefetch(q + 64 * prefetch + j, 0, 3);
        for (int j = 0; j < 64; ++j)
          acc[j % 16] += q[j];
      }
    for (int j = 0; j < 16; ++j)
      sum += acc[j];
  }
  double dt = omp_get_wtime() - t0;
  /* The bytes every thread read (whole blocks of its share). */
  size_t per_thread = n / (size_t)threads / (size_t)streams / 64 * 64 * (size_t)streams;
  return sum == sum ? (double)(per_thread * (size_t)threads * sizeof(float)) / dt / 1e9 : 0.0;
}
