// Packing weight matrices into panels (NOTE [packed panels] in
// kernels/cpu/fused_decode.hpp); the kernels that read them are in
// kernels/cpu/decode_kernels_body.hpp.
#include "kernels/cpu/fused_decode.hpp"

#include <algorithm>

namespace troupe::kernels::cpu {

int64_t packed_size(int64_t rows, int64_t cols, int64_t panel_rows) {
  return (rows + panel_rows - 1) / panel_rows * panel_rows * cols;
}

namespace {

// Rows [r0, r0 + n) of a row-major W [*, cols], n <= width, into the first
// n of `width` rows of a panel of `stride` rows at `out` (zeros after
// them): a k-row of the panel at a time, so that the writes are sequential
// (the reads touch n lines that stay in L1 for the next k).
void pack_rows(const float* w, int64_t r0, int64_t n, int64_t cols, int64_t width, int64_t stride,
               float* out) {
  const float* rows = w + r0 * cols;
  for (int64_t k = 0; k < cols; ++k) {
    float* o = out + k * stride;
    for (int64_t j = 0; j < n; ++j)
      o[j] = rows[j * cols + k];
    for (int64_t j = n; j < width; ++j)
      o[j] = 0.0f;
  }
}

} // namespace

void pack_panels(const float* w, int64_t rows, int64_t cols, int64_t panel_rows, float* out) {
  for (int64_t p = 0; p < rows; p += panel_rows, out += panel_rows * cols)
    pack_rows(w, p, std::min(panel_rows, rows - p), cols, panel_rows, panel_rows, out);
}

void pack_swiglu(const float* w1, const float* w3, int64_t rows, int64_t cols, int64_t panel_rows,
                 float* out) {
  const int64_t half = panel_rows / 2;
  for (int64_t p = 0; p < rows; p += half, out += panel_rows * cols) {
    const int64_t n = std::min(half, rows - p);
    pack_rows(w1, p, n, cols, half, panel_rows, out);
    pack_rows(w3, p, n, cols, half, panel_rows, out + half);
  }
}

} // namespace troupe::kernels::cpu
