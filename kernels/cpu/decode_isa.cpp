#include "kernels/cpu/decode_isa.hpp"

#include "kernels/cpu/decode_kernels.hpp"

#include <iterator>

namespace troupe::kernels::cpu {

namespace {

const char* requirement(decode_isa isa) {
  switch (isa) {
  case decode_isa::avx512:
    return "AVX-512 F/BW/CD/DQ/VL (x86-64-v4)";
  case decode_isa::avx2:
    return "AVX2 and FMA (x86-64-v3)";
  default:
    return "nothing";
  }
}

} // namespace

const cpu_levels& cpu_levels::here() {
  static const cpu_levels levels = [] {
    cpu_levels l;
#if defined(__x86_64__) && !defined(__clang__)
    l.x86_64_v4 = __builtin_cpu_supports("x86-64-v4");
    l.x86_64_v3 = __builtin_cpu_supports("x86-64-v3");
#elif defined(__x86_64__)
    // clang 14 (the fuzz builds) knows the features, not the levels: the
    // ones the kernels of each level use.
    l.x86_64_v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                  __builtin_cpu_supports("bmi2");
    l.x86_64_v4 = l.x86_64_v3 && __builtin_cpu_supports("avx512f") &&
                  __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                  __builtin_cpu_supports("avx512vl");
#endif
    return l;
  }();
  return levels;
}

bool cpu_supports(decode_isa isa, const cpu_levels& levels) {
  switch (isa) {
  case decode_isa::avx512:
    return levels.x86_64_v4;
  case decode_isa::avx2:
    return levels.x86_64_v3;
  case decode_isa::automatic:
  case decode_isa::baseline:
    return true;
  }
  return false;
}

std::vector<decode_isa> supported_decode_isas(const cpu_levels& levels) {
  std::vector<decode_isa> out;
  for (auto isa : {decode_isa::avx512, decode_isa::avx2, decode_isa::baseline})
    if (cpu_supports(isa, levels))
      out.push_back(isa);
  return out;
}

decode_isa best_decode_isa() {
  static const decode_isa best = supported_decode_isas().front();
  return best;
}

decode_isa resolve(decode_isa isa) {
  return isa == decode_isa::automatic ? best_decode_isa() : isa;
}

std::string unsupported_why(decode_isa isa, const cpu_levels& levels) {
  if (static_cast<size_t>(isa) >= enum_count<decode_isa>())
    return "expected one of " + enum_name_list<decode_isa>() + ", got " +
           std::to_string(static_cast<int>(isa));
  if (cpu_supports(isa, levels))
    return {};
  std::string runs;
  for (auto s : supported_decode_isas(levels))
    runs += (runs.empty() ? "" : ", ") + std::string{to_string(s)};
  return std::string{to_string(isa)} + ": this CPU lacks " + requirement(isa) + "; it runs " + runs;
}

const decode_kernels& decode_kernels_of(decode_isa isa) {
  switch (resolve(isa)) {
  case decode_isa::avx512:
    return decode_tables::avx512;
  case decode_isa::avx2:
    return decode_tables::avx2;
  default:
    return decode_tables::baseline;
  }
}

int64_t panel_rows(decode_isa isa) {
  return decode_kernels_of(isa).panel_rows;
}

namespace {

// NOTE [decode crossovers]: from bench_decode's sweep (the model step alone,
// batch 1-64 at 1 and 2 threads, the 24.4M shape, medians of 5 interleaved
// rounds, two runs; docs/benchmarks.md "CPU decode on every instruction
// set"). On every path the panels beat the stored rows from batch 2. The
// AVX-512 and AVX2 kernels beat ATen at every batch measured (1.5-4.8x).
// The baseline path (SSE2: 4 floats a vector, a 6-token tile) is
// arithmetic-bound soonest: its stored-row tiles overtake its panels from
// batch 6, and ATen's OpenBLAS GEMM overtakes both from batch 24 at 1
// thread and 16-48 at 2 (runs differ), so from 24 on its steps take ATen.
constexpr decode_crossover kCrossovers[] = {
    {decode_isa::avx512, 2, 0, 0, "AMD EPYC (Zen 4, AVX-512), 2 vCPUs, 2026-11-26"},
    {decode_isa::avx2, 2, 0, 0, "the same machine, the AVX2 path forced"},
    {decode_isa::baseline, 2, 6, 24, "the same machine, the baseline path forced"},
};

} // namespace

const decode_crossover& crossover(decode_isa isa) {
  const auto resolved = resolve(isa);
  for (const auto& c : kCrossovers)
    if (c.isa == resolved)
      return c;
  return kCrossovers[std::size(kCrossovers) - 1];
}

decode_choice choose_decode(decode_isa isa, int64_t batch, decode_path path, panels_mode panels) {
  const auto& c = crossover(isa);
  decode_choice out;
  out.fused = path == decode_path::fused ||
              (path == decode_path::automatic && (c.aten_from == 0 || batch < c.aten_from));
  out.panels =
      out.fused && batch > 1 &&
      (panels == panels_mode::on || (panels == panels_mode::automatic && batch >= c.panels_from &&
                                     (c.rows_from == 0 || batch < c.rows_from)));
  return out;
}

bool wants_panels(decode_isa isa, int64_t batch, decode_path path, panels_mode panels) {
  if (panels == panels_mode::on) // asked for: made at the first step that reads it
    return path != decode_path::aten;
  for (int64_t b = 2; b <= batch; ++b)
    if (choose_decode(isa, b, path, panels).panels)
      return true;
  return false;
}

} // namespace troupe::kernels::cpu
