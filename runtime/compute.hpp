#pragma once
// Process-wide CPU compute settings for LibTorch.

namespace troupe::runtime {

/// Sets ATen's intra-op thread count (OpenMP): `requested` threads, or one
/// per hardware thread when 0. Returns the count now in effect. With
/// OpenBLAS's OpenMP build (scripts/setup.sh) BLAS shares this pool; with its
/// pthread build the two pools contend (see docs/benchmarks.md).
int set_compute_threads(int requested);

} // namespace troupe::runtime
