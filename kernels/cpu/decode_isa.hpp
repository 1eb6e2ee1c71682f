#pragma once
// The instruction-set paths of the CPU decode kernels (kernels/cpu/
// fused_decode.hpp, the sampler's softmax row): which ones this CPU runs,
// which one `auto` picks, and the packed-panel width each one reads.
//
// NOTE [decode isa]: each path is the same kernel source compiled for one
// instruction set (kernels/cpu/decode_kernels_body.hpp under a target
// pragma in decode_avx512.cpp, decode_avx2.cpp, decode_baseline.cpp), with
// its own vector width and tile sizes, and reached through a table of
// function pointers (kernels/cpu/decode_kernels.hpp) chosen once, when the
// path is named. Every path this CPU supports can be forced (the engine key
// `decode_isa`, `troupe generate --decode-isa`, the benches' `--isa`), so
// that each is tested and measured on one machine; a path it lacks is
// refused, never run. No environment variable chooses: the caller does.

#include "runtime/enum_names.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::kernels::cpu {

enum class decode_isa : uint8_t { automatic, avx512, avx2, baseline };
TROUPE_ENUM_NAMES(decode_isa, "auto", "avx512", "avx2", "baseline")

/// The instruction-set levels of a CPU that the paths need: avx512 is
/// x86-64-v4 (AVX-512 F/BW/CD/DQ/VL), avx2 is x86-64-v3 (AVX2, FMA, BMI2,
/// F16C); baseline is whatever the build targets (SSE2 on x86-64).
struct cpu_levels {
  bool x86_64_v4 = false;
  bool x86_64_v3 = false;
  /// This machine's (read once).
  static const cpu_levels& here();
};

/// Whether a CPU with `levels` runs the path (`automatic`: always).
bool cpu_supports(decode_isa isa, const cpu_levels& levels = cpu_levels::here());

/// The paths such a CPU runs, fastest first (never `automatic`).
std::vector<decode_isa> supported_decode_isas(const cpu_levels& levels = cpu_levels::here());

/// The path `automatic` picks: the widest this CPU supports.
decode_isa best_decode_isa();

/// `isa` with `automatic` resolved to best_decode_isa().
decode_isa resolve(decode_isa isa);

/// Empty when this CPU runs `isa`; else why not, naming the path and the
/// ones it runs (for the caller's error: a config key, a flag).
std::string unsupported_why(decode_isa isa, const cpu_levels& levels = cpu_levels::here());

/// Rows per packed panel of the path's batched projections (NOTE [packed
/// panels] in kernels/cpu/fused_decode.hpp): two of its vectors.
int64_t panel_rows(decode_isa isa);

/// Whether batched decode steps read a packed copy of the weights: "auto"
/// where the crossover table says it wins, "on" for every step of two
/// requests or more, "off" never (no copy is made).
enum class panels_mode : uint8_t { automatic, on, off };
TROUPE_ENUM_NAMES(panels_mode, "auto", "on", "off")

/// Which code runs a decode step: the fused kernel, the per-operator ATen
/// path, or (auto) whichever the crossover table says is faster at the
/// step's batch size on the path.
enum class decode_path : uint8_t { automatic, fused, aten };
TROUPE_ENUM_NAMES(decode_path, "auto", "fused", "aten")

/// NOTE [decode crossovers]: the batch sizes at which the choices change,
/// per instruction-set path, measured with bench/bench_decode (its sweep
/// prints these points; docs/benchmarks.md has the tables). A batched step
/// reads the packed panels from panels_from on and the stored rows again
/// from rows_from on (0: never); from aten_from on (0: never) the ATen path
/// is faster than the fused kernel. `measured_on` names the machine.
struct decode_crossover {
  decode_isa isa;
  int64_t panels_from;
  int64_t rows_from;
  int64_t aten_from;
  const char* measured_on;
};

/// The row of the table for a path (`automatic` resolved).
const decode_crossover& crossover(decode_isa isa);

struct decode_choice {
  bool fused;  // the fused kernel (else ATen)
  bool panels; // from the packed copy (fused steps of 2+ requests only)
};

/// How a decode step of `batch` requests runs on the path.
decode_choice choose_decode(decode_isa isa, int64_t batch, decode_path path, panels_mode panels);

/// Whether an engine whose steps batch up to `batch` requests wants the
/// packed copy: some step would read it, or it is asked for ("on").
bool wants_panels(decode_isa isa, int64_t batch, decode_path path, panels_mode panels);

} // namespace troupe::kernels::cpu
