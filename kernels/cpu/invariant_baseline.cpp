// The batch-invariant kernels for whatever the build targets (SSE2 on
// x86-64): multiplies and adds, no fused multiply-add. NOTE
// [batch-invariant kernels] in kernels/cpu/invariant.hpp.
#include "kernels/cpu/invariant.hpp"
#include "kernels/cpu/softmax_row.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#define TROUPE_INVARIANT_TABLE baseline
#define TROUPE_INVARIANT_NAME "baseline"
#define TROUPE_INVARIANT_FMA 0
#include "kernels/cpu/invariant_body.hpp"
