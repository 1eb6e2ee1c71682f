#include "kernels/cpu/invariant.hpp"

#include "kernels/cpu/decode_isa.hpp"

namespace troupe::kernels::cpu {

const invariant_kernels& invariant_kernels_here() {
  static const invariant_kernels& k =
      cpu_levels::here().x86_64_v3 ? invariant_tables::avx2 : invariant_tables::baseline;
  return k;
}

} // namespace troupe::kernels::cpu
