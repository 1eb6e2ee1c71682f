// The CPU decode's kernels for AVX2 + FMA (x86-64-v3): 16 vector registers of 8
// floats; a panel tile holds 6 tokens (12 accumulators, 2 weight vectors, a
// broadcast).
// NOTE [decode isa] in kernels/cpu/decode_isa.hpp.
#include "kernels/cpu/decode_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__)

#pragma GCC target("arch=x86-64-v3")
#define TROUPE_DECODE_TABLE avx2
#define TROUPE_DECODE_LANES 8
#define TROUPE_DECODE_TILE 6
#include "kernels/cpu/decode_kernels_body.hpp"

#else // another architecture: the path is not built

const troupe::kernels::cpu::decode_kernels troupe::kernels::cpu::decode_tables::avx2 =
    troupe::kernels::cpu::unbuilt_table(troupe::kernels::cpu::decode_isa::avx2);

#endif
