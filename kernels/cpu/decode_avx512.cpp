// The CPU decode's kernels for AVX-512 (x86-64-v4): 32 vector registers of 16
// floats; a panel tile holds 12 tokens (24 accumulators, 2 weight vectors, a
// broadcast).
// NOTE [decode isa] in kernels/cpu/decode_isa.hpp.
#include "kernels/cpu/decode_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__x86_64__)

#pragma GCC target("arch=x86-64-v4")
#define TROUPE_DECODE_TABLE avx512
#define TROUPE_DECODE_LANES 16
#define TROUPE_DECODE_TILE 12
#include "kernels/cpu/decode_kernels_body.hpp"

#else // another architecture: the path is not built

const troupe::kernels::cpu::decode_kernels troupe::kernels::cpu::decode_tables::avx512 =
    troupe::kernels::cpu::unbuilt_table(troupe::kernels::cpu::decode_isa::avx512);

#endif
