// NOTE [gcc fuzz build]: the fuzz targets that link LibTorch or gRPC
// (role_messages, job_service, node_service, dashboard) are built for
// libFuzzer with GCC, not clang: Debian's LibTorch 1.13 headers do not
// compile with clang 14 in C++20 (NOTE [fuzz targets]). scripts/fuzz.sh
// configures a CMake build of its own with TROUPE_FUZZ_ENGINE set, which
// compiles every troupe object with GCC's AddressSanitizer and
// UndefinedBehaviorSanitizer and its -fsanitize-coverage=trace-pc,trace-cmp,
// and links each target with libFuzzer's engine (clang's runtime archive,
// whose own trace-pc hook — it only says the mode is unsupported — the
// script weakens) and this file.
//
// GCC's trace-pc calls __sanitizer_cov_trace_pc() at every basic block.
// Here that call counts into libFuzzer's "extra counters" (every byte of the
// __libfuzzer_extra_counters section is a coverage counter it clears before
// each input and reads after): one byte per hashed return address. Distinct
// blocks may share a byte (2^18 of them for troupe's few hundred thousand
// blocks); libFuzzer still sees most new edges, and its comparison hooks
// (trace-cmp) are the engine's own. Compiled without instrumentation of its
// own (the attributes): this function must not call itself.
#include <cstddef>
#include <cstdint>

namespace {
constexpr int counter_bits = 18;
} // namespace

extern "C" {

__attribute__((section("__libfuzzer_extra_counters"), used))
uint8_t troupe_fuzz_block_counters[size_t{1} << counter_bits];

__attribute__((no_sanitize_coverage, no_sanitize("address", "undefined"))) void
__sanitizer_cov_trace_pc() {
  const auto pc = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  // Fibonacci hashing: the top bits of pc × 2^64/φ spread nearby blocks.
  const uint64_t slot = (static_cast<uint64_t>(pc) * 0x9E3779B97F4A7C15ull) >> (64 - counter_bits);
  ++troupe_fuzz_block_counters[slot]; // (wraps, as libFuzzer's own counters do)
}

// GCC's trace-cmp also reports floating-point comparisons, which libFuzzer
// has no hook for: they carry no hint it could use.
__attribute__((no_sanitize_coverage)) void __sanitizer_cov_trace_cmpf(float, float) {}
__attribute__((no_sanitize_coverage)) void __sanitizer_cov_trace_cmpd(double, double) {}

} // extern "C"
