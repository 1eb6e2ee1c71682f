// The CPU decode's kernels for the build's baseline (SSE2 on x86-64): 16 vector
// registers of 4 floats; a panel tile holds 6 tokens.
// NOTE [decode isa] in kernels/cpu/decode_isa.hpp.
#include "kernels/cpu/decode_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#define TROUPE_DECODE_TABLE baseline
#define TROUPE_DECODE_LANES 4
#define TROUPE_DECODE_TILE 6
#include "kernels/cpu/decode_kernels_body.hpp"
