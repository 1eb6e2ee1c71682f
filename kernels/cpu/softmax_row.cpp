#include "kernels/cpu/softmax_row.hpp"

#include "kernels/cpu/decode_kernels.hpp"

#include <cmath>

namespace troupe::kernels::detail {

softmax_row_stats softmax_row(const float* x, int64_t n, float scale, float* weights) {
  static const auto row = cpu::decode_kernels_of(cpu::decode_isa::automatic).softmax_row;
  return row(x, n, scale, weights);
}

softmax_row_stats softmax_row(const float* x, int64_t n, float scale, float* weights,
                              cpu::decode_isa isa) {
  return cpu::decode_kernels_of(isa).softmax_row(x, n, scale, weights);
}

double softmax_row_logprob(const softmax_row_stats& s, float x_v, float scale) {
  return static_cast<double>(scale) * (static_cast<double>(x_v) - static_cast<double>(s.max)) -
         std::log(s.sum);
}

} // namespace troupe::kernels::detail
