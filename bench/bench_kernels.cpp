// Kernels benchmarks (CPU): chunked vs full-vocabulary token log-probs and
// entropy, and the GAE scan vs naive baselines, each against its baseline
// measured in the same run. Besides time, log-prob benchmarks report the peak
// bytes of tensor memory allocated above what existed before the call
// (`peak_extra_MiB`), measured by a counting wrapper around LibTorch's CPU
// allocator. After the runs, main() prints the ratios.
//
//   ./bench_kernels [--benchmark_filter=...]

#include "kernels/gae.hpp"
#include "kernels/logprobs.hpp"

#include <benchmark/benchmark.h>
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <map>
#include <stdexcept>
#include <string>

#include <unistd.h>

namespace {

using namespace troupe;

// ---- allocation accounting ---------------------------------------------------

// Wraps the default CPU allocator; counts live bytes and their peak.
class counting_allocator final : public c10::Allocator {
public:
  explicit counting_allocator(c10::Allocator* inner) : inner_(inner) {}

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override {
    return wrap(n);
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override {
    return wrap(n);
  }
#endif

  int64_t live() const {
    return live_.load();
  }
  int64_t peak() const {
    return peak_.load();
  }
  void reset_peak() {
    peak_.store(live_.load());
  }

private:
  struct context {
    c10::DataPtr inner;
    int64_t bytes;
    const counting_allocator* owner;
  };

  c10::DataPtr wrap(size_t n) const {
    auto inner = inner_->allocate(n);
    void* data = inner.get();
    auto device = inner.device();
    auto bytes = static_cast<int64_t>(n);
    auto now = live_.fetch_add(bytes) + bytes;
    auto peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    auto* ctx = new context{std::move(inner), bytes, this};
    return {data, ctx, &release, device};
  }

  static void release(void* p) {
    auto* ctx = static_cast<context*>(p);
    ctx->owner->live_.fetch_sub(ctx->bytes);
    delete ctx; // frees through the inner DataPtr
  }

  c10::Allocator* inner_;
  mutable std::atomic<int64_t> live_{0};
  mutable std::atomic<int64_t> peak_{0};
};

counting_allocator* g_alloc = nullptr;

// Peak tensor bytes allocated by one call of f above what was live before it.
template <class F>
double peak_extra_mib(F&& f) {
  g_alloc->reset_peak();
  auto before = g_alloc->live();
  f();
  return static_cast<double>(g_alloc->peak() - before) / (1024.0 * 1024.0);
}

template <class T>
T unwrap(expected<T> x) {
  if (!x)
    throw std::runtime_error(describe(x.error()));
  return std::move(*x);
}

// ---- log-probs ---------------------------------------------------------------

constexpr int64_t kB = 4, kT = 256, kV = 32000;

struct logits_case {
  at::Tensor logits, tokens;
  explicit logits_case(at::ScalarType type) {
    torch::manual_seed(0);
    logits = (2.0 * torch::randn({kB, kT, kV})).to(type);
    tokens = torch::randint(0, kV, {kB, kT}, torch::kLong);
  }
};

const logits_case& case_of(at::ScalarType type) {
  static const logits_case f32{at::kFloat};
  static const logits_case bf16{at::kBFloat16};
  return type == at::kFloat ? f32 : bf16;
}

void finish_logits(benchmark::State& state, double mib) {
  state.counters["peak_extra_MiB"] = mib;
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(kB * kT),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

void BM_logprobs_full(benchmark::State& state, at::ScalarType type) {
  const auto& c = case_of(type);
  for (auto _ : state)
    benchmark::DoNotOptimize(unwrap(kernels::token_log_probs_full(c.logits, c.tokens)));
  finish_logits(state,
                peak_extra_mib([&] { unwrap(kernels::token_log_probs_full(c.logits, c.tokens)); }));
}

void BM_logprobs_chunked(benchmark::State& state, at::ScalarType type) {
  const auto& c = case_of(type);
  kernels::logits_options opts{.chunk_size = state.range(0)};
  for (auto _ : state)
    benchmark::DoNotOptimize(unwrap(kernels::token_log_probs(c.logits, c.tokens, opts)));
  finish_logits(
      state, peak_extra_mib([&] { unwrap(kernels::token_log_probs(c.logits, c.tokens, opts)); }));
}

// Full baseline of log-probs + entropy: one log_softmax, probabilities from it.
at::Tensor full_logprobs_entropy(const at::Tensor& logits, const at::Tensor& tokens) {
  auto lsm = torch::log_softmax(logits.to(torch::kFloat), -1);
  auto lp = lsm.gather(-1, tokens.unsqueeze(-1)).squeeze(-1);
  auto h = -(lsm.exp() * lsm).sum(-1);
  return lp + h;
}

void BM_logprobs_entropy_full(benchmark::State& state, at::ScalarType type) {
  const auto& c = case_of(type);
  for (auto _ : state)
    benchmark::DoNotOptimize(full_logprobs_entropy(c.logits, c.tokens));
  finish_logits(state, peak_extra_mib([&] { full_logprobs_entropy(c.logits, c.tokens); }));
}

void BM_logprobs_entropy_chunked(benchmark::State& state, at::ScalarType type) {
  const auto& c = case_of(type);
  kernels::logits_options opts{.chunk_size = state.range(0)};
  for (auto _ : state)
    benchmark::DoNotOptimize(
        unwrap(kernels::token_log_probs_and_entropy(c.logits, c.tokens, opts)).entropy);
  finish_logits(state, peak_extra_mib([&] {
                  unwrap(kernels::token_log_probs_and_entropy(c.logits, c.tokens, opts));
                }));
}

BENCHMARK_CAPTURE(BM_logprobs_full, f32, at::kFloat)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_logprobs_chunked, f32, at::kFloat)
    ->Arg(1024)
    ->Arg(4096)
    ->Arg(16384)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_logprobs_full, bf16, at::kBFloat16)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_logprobs_chunked, bf16, at::kBFloat16)
    ->Arg(4096)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_logprobs_entropy_full, f32, at::kFloat)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_logprobs_entropy_chunked, f32, at::kFloat)
    ->Arg(4096)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// ---- GAE -----------------------------------------------------------------------

constexpr int64_t kGaeB = 64, kGaeT = 512;

struct gae_case {
  at::Tensor rewards, values, mask;
  gae_case() {
    torch::manual_seed(1);
    rewards = torch::randn({kGaeB, kGaeT});
    values = torch::randn({kGaeB, kGaeT});
    auto lengths = torch::randint(kGaeT / 4, kGaeT + 1, {kGaeB, 1});
    mask = torch::arange(kGaeT).unsqueeze(0).lt(lengths); // right padded
  }
};

const gae_case& gae_inputs() {
  static const gae_case c;
  return c;
}

// Baseline 1: per-element scalar loop through at::Tensor indexing (the direct
// transliteration of the Python reference loop).
std::pair<at::Tensor, at::Tensor> gae_naive(const at::Tensor& r, const at::Tensor& v,
                                            const at::Tensor& m, double gamma, double lambda) {
  auto adv = torch::zeros_like(r);
  for (int64_t b = 0; b < r.size(0); ++b) {
    double next = 0, carry = 0;
    for (int64_t t = r.size(1) - 1; t >= 0; --t) {
      if (!m[b][t].item<bool>())
        continue;
      double value = v[b][t].item<double>();
      carry = r[b][t].item<double>() + gamma * next - value + gamma * lambda * carry;
      adv[b][t] = carry;
      next = value;
    }
  }
  return {adv, (adv + v) * m};
}

// Baseline 2: loop over T backwards with tensor ops over the batch (verl-style).
std::pair<at::Tensor, at::Tensor> gae_columns(const at::Tensor& r, const at::Tensor& v,
                                              const at::Tensor& m, double gamma, double lambda) {
  auto mf = m.to(r.scalar_type());
  auto next = torch::zeros({r.size(0)}, r.options());
  auto carry = torch::zeros({r.size(0)}, r.options());
  std::vector<at::Tensor> cols(r.size(1));
  for (int64_t t = r.size(1) - 1; t >= 0; --t) {
    auto mt = mf.select(1, t), vt = v.select(1, t);
    auto delta = r.select(1, t) + gamma * next - vt;
    auto step = delta + gamma * lambda * carry;
    carry = mt * step + (1 - mt) * carry;
    next = mt * vt + (1 - mt) * next;
    cols[t] = step * mt;
  }
  auto adv = torch::stack(cols, 1);
  return {adv, (adv + v) * mf};
}

void BM_gae_library(benchmark::State& state) {
  const auto& c = gae_inputs();
  for (auto _ : state)
    benchmark::DoNotOptimize(unwrap(kernels::gae(c.rewards, c.values, c.mask, 1.0, 0.95)));
}

void BM_gae_naive_scalar(benchmark::State& state) {
  const auto& c = gae_inputs();
  for (auto _ : state)
    benchmark::DoNotOptimize(gae_naive(c.rewards, c.values, c.mask, 1.0, 0.95));
}

void BM_gae_column_ops(benchmark::State& state) {
  const auto& c = gae_inputs();
  for (auto _ : state)
    benchmark::DoNotOptimize(gae_columns(c.rewards, c.values, c.mask, 1.0, 0.95));
}

BENCHMARK(BM_gae_library)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_gae_column_ops)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(BM_gae_naive_scalar)->Unit(benchmark::kMicrosecond)->UseRealTime();

// ---- reporting -------------------------------------------------------------------

// Console output plus a record of each run's real time (ns) and memory counter.
class recording_reporter : public benchmark::ConsoleReporter {
public:
  recording_reporter() : ConsoleReporter(isatty(fileno(stdout)) ? OO_Defaults : OO_Tabular) {}

  struct result {
    double real_ns = 0;
    double peak_mib = -1;
  };
  std::map<std::string, result> results;

  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& run : runs) {
      if (run.error_occurred || run.run_type != Run::RT_Iteration)
        continue;
      result r;
      r.real_ns = run.real_accumulated_time * 1e9 / static_cast<double>(run.iterations);
      if (auto it = run.counters.find("peak_extra_MiB"); it != run.counters.end())
        r.peak_mib = it->second.value;
      results[run.benchmark_name()] = r;
    }
    ConsoleReporter::ReportRuns(runs);
  }
};

void print_ratio(const recording_reporter& rep, const std::string& label, const std::string& num,
                 const std::string& den) {
  auto a = rep.results.find(num), b = rep.results.find(den);
  if (a == rep.results.end() || b == rep.results.end())
    return;
  double ratio = a->second.real_ns / b->second.real_ns;
  std::printf("%-44s time %.4gx (%.3g ms vs %.3g ms, %.3gx faster)", (label + ":").c_str(), ratio,
              a->second.real_ns * 1e-6, b->second.real_ns * 1e-6, 1.0 / ratio);
  if (a->second.peak_mib >= 0 && b->second.peak_mib > 0)
    std::printf(";  peak extra memory %.3f MiB vs %.2f MiB (%.4fx)", a->second.peak_mib,
                b->second.peak_mib, a->second.peak_mib / b->second.peak_mib);
  std::printf("\n");
}

} // namespace

int main(int argc, char** argv) {
  static counting_allocator alloc{c10::GetCPUAllocator()};
  g_alloc = &alloc;
  c10::SetCPUAllocator(&alloc, /*priority=*/255);

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv))
    return 1;
  std::printf("LibTorch %s, ATen intra-op threads %d\n", TORCH_VERSION, at::get_num_threads());
  recording_reporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  benchmark::Shutdown();

  std::printf("\nRatios (same run; < 1 means faster / smaller than the baseline):\n");
  print_ratio(rep, "chunked/full log-probs f32 (chunk 1024)",
              "BM_logprobs_chunked/f32/1024/real_time", "BM_logprobs_full/f32/real_time");
  print_ratio(rep, "chunked/full log-probs f32 (chunk 4096)",
              "BM_logprobs_chunked/f32/4096/real_time", "BM_logprobs_full/f32/real_time");
  print_ratio(rep, "chunked/full log-probs f32 (chunk 16384)",
              "BM_logprobs_chunked/f32/16384/real_time", "BM_logprobs_full/f32/real_time");
  print_ratio(rep, "chunked/full log-probs bf16 (chunk 4096)",
              "BM_logprobs_chunked/bf16/4096/real_time", "BM_logprobs_full/bf16/real_time");
  print_ratio(rep, "chunked/full log-probs+entropy f32 (4096)",
              "BM_logprobs_entropy_chunked/f32/4096/real_time",
              "BM_logprobs_entropy_full/f32/real_time");
  print_ratio(rep, "GAE library/naive scalar loop", "BM_gae_library/real_time",
              "BM_gae_naive_scalar/real_time");
  print_ratio(rep, "GAE library/column tensor ops", "BM_gae_library/real_time",
              "BM_gae_column_ops/real_time");
  return 0;
}
