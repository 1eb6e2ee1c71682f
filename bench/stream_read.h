/* A multi-stream read-bandwidth probe for bench_decode (stream_read.c). */
#ifndef TROUPE_BENCH_STREAM_READ_H
#define TROUPE_BENCH_STREAM_READ_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* GB/s of `threads` threads reading p[0, n) once, each its share as
 * `streams` interleaved streams; `prefetch` > 0 prefetches that many 256-byte
 * blocks ahead of each stream. */
double stream_read_gbps(const float* p, size_t n, int threads, int streams, int prefetch);

#ifdef __cplusplus
}
#endif

#endif
