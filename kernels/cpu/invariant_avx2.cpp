// The batch-invariant kernels for AVX2 + FMA (x86-64-v3). NOTE
// [batch-invariant kernels] in kernels/cpu/invariant.hpp.
#include "kernels/cpu/invariant.hpp"
#include "kernels/cpu/softmax_row.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#if defined(__x86_64__)

#include <immintrin.h>

#pragma GCC target("arch=x86-64-v3")
#define TROUPE_INVARIANT_TABLE avx2
#define TROUPE_INVARIANT_NAME "avx2"
#define TROUPE_INVARIANT_FMA 1
#include "kernels/cpu/invariant_body.hpp"

#else // another architecture: the same order without fused multiply-adds

#define TROUPE_INVARIANT_TABLE avx2
#define TROUPE_INVARIANT_NAME "baseline"
#define TROUPE_INVARIANT_FMA 0
#include "kernels/cpu/invariant_body.hpp"

#endif
