#pragma once
// Process-wide CPU compute settings for LibTorch.

#include <cstdint>

namespace troupe::runtime {

/// Sets ATen's intra-op thread count (OpenMP): `requested` threads, or one
/// per hardware thread when 0. Returns the count now in effect. With
/// OpenBLAS's OpenMP build (scripts/setup.sh) BLAS shares this pool; with its
/// pthread build the two pools contend (see docs/benchmarks.md).
int set_compute_threads(int requested);

/// The same for the calling thread only: threads that start later, and
/// the others, keep the process's count (an actor on its own thread that
/// shares the cores with its peers: NOTE [rollout group]).
int set_thread_compute_threads(int requested);

/// Hands freed heap memory back to the system (malloc_trim), so releasing
/// large buffers lowers the resident set.
void return_free_memory();

/// This process's peak and current resident set, bytes (VmHWM, VmRSS).
struct resident_memory {
  int64_t peak = 0;
  int64_t current = 0;
};
resident_memory resident_set();

} // namespace troupe::runtime
