// Fuzz target: a Hugging Face config.json (models/config.hpp), read from
// every checkpoint a job names. Parsing succeeds or answers an error; a
// config that parses and validates writes back (to_hf_config_json) as
// JSON that parses to the same config, and its derived sizes are computed
// without overflow (UBSan watches the arithmetic).
#include "models/config.hpp"
#include "tests/fuzz/fuzz_input.hpp"

#include <cstdint>

using namespace troupe;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text{fuzz::text_of(data, size)};
  auto c = models::parse_hf_config(text, "config.json");
  if (!c || !models::validate(*c))
    return 0;
  const auto again = models::to_hf_config_json(*c);
  auto back = models::parse_hf_config(again, "config.json (written back)");
  if (!back || models::to_hf_config_json(*back) != again)
    fuzz::broken();
  (void)models::rope_inv_freq(*c);
  for (auto isa : {kernels::cpu::decode_isa::baseline, kernels::cpu::decode_isa::avx2,
                   kernels::cpu::decode_isa::avx512})
    (void)models::decode_panels_bytes(*c, isa);
  return 0;
}
