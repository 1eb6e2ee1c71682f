// NOTE [decode isa]: each named instruction-set path dispatches to its own
// table (the width it was compiled for), `auto` to the widest this CPU runs,
// and a path a CPU lacks is refused with the reason; the crossover table's
// choices (NOTE [decode crossovers]).
#include "kernels/cpu/decode_isa.hpp"
#include "kernels/cpu/decode_kernels.hpp"

#include <gtest/gtest.h>

using namespace troupe::kernels::cpu;

namespace {

TEST(DecodeIsa, EachNamedPathDispatchesToTheTableBuiltForIt) {
  const auto paths = supported_decode_isas();
  ASSERT_FALSE(paths.empty());
  EXPECT_EQ(paths.back(), decode_isa::baseline); // every CPU runs it
  EXPECT_EQ(best_decode_isa(), paths.front());
  EXPECT_EQ(resolve(decode_isa::automatic), paths.front());
  for (auto isa : paths) {
    SCOPED_TRACE(std::string{to_string(isa)});
    const auto& k = decode_kernels_of(isa);
    EXPECT_TRUE(k.built);
    EXPECT_EQ(k.isa, isa);
    EXPECT_EQ(k.lanes, isa == decode_isa::avx512 ? 16 : isa == decode_isa::avx2 ? 8 : 4);
    EXPECT_EQ(panel_rows(isa), 2 * k.lanes);
    EXPECT_EQ(k.panel_tokens, isa == decode_isa::avx512 ? 12 : 6);
    EXPECT_TRUE(unsupported_why(isa).empty());
  }
  EXPECT_EQ(&decode_kernels_of(decode_isa::automatic), &decode_kernels_of(paths.front()));
}

TEST(DecodeIsa, APathTheCpuLacksIsRefusedWithWhatItRuns) {
  cpu_levels avx2_only;
  avx2_only.x86_64_v3 = true;
  EXPECT_EQ(supported_decode_isas(avx2_only),
            (std::vector<decode_isa>{decode_isa::avx2, decode_isa::baseline}));
  EXPECT_FALSE(cpu_supports(decode_isa::avx512, avx2_only));
  EXPECT_EQ(unsupported_why(decode_isa::avx512, avx2_only),
            "avx512: this CPU lacks AVX-512 F/BW/CD/DQ/VL (x86-64-v4); it runs avx2, baseline");
  cpu_levels old;
  EXPECT_EQ(unsupported_why(decode_isa::avx2, old),
            "avx2: this CPU lacks AVX2 and FMA (x86-64-v3); it runs baseline");
  EXPECT_TRUE(unsupported_why(decode_isa::baseline, old).empty());
  EXPECT_TRUE(unsupported_why(decode_isa::automatic, old).empty());
  EXPECT_EQ(unsupported_why(static_cast<decode_isa>(9)),
            "expected one of auto, avx512, avx2, baseline, got 9");
}

TEST(DecodeIsa, ChoicesFollowTheCrossoverTableAndTheForcedModes) {
  for (auto isa : supported_decode_isas()) {
    SCOPED_TRACE(std::string{to_string(isa)});
    const auto& c = crossover(isa);
    EXPECT_EQ(c.isa, isa);
    EXPECT_NE(std::string{c.measured_on}, "");
    for (int64_t batch = 1; batch <= 64; ++batch) {
      auto a = choose_decode(isa, batch, decode_path::automatic, panels_mode::automatic);
      EXPECT_EQ(a.fused, c.aten_from == 0 || batch < c.aten_from) << batch;
      EXPECT_EQ(a.panels, a.fused && batch > 1 && batch >= c.panels_from &&
                              (c.rows_from == 0 || batch < c.rows_from))
          << batch;
      // Forced: the fused kernel, from the panels at every batched step.
      auto f = choose_decode(isa, batch, decode_path::fused, panels_mode::on);
      EXPECT_TRUE(f.fused);
      EXPECT_EQ(f.panels, batch > 1);
      EXPECT_FALSE(choose_decode(isa, batch, decode_path::fused, panels_mode::off).panels);
      EXPECT_FALSE(choose_decode(isa, batch, decode_path::aten, panels_mode::on).fused);
    }
    EXPECT_FALSE(wants_panels(isa, 1, decode_path::automatic, panels_mode::automatic));
    EXPECT_TRUE(wants_panels(isa, 1, decode_path::automatic, panels_mode::on)); // asked for
    EXPECT_FALSE(wants_panels(isa, 64, decode_path::automatic, panels_mode::off));
    EXPECT_FALSE(wants_panels(isa, 64, decode_path::aten, panels_mode::on));
  }
}

} // namespace
