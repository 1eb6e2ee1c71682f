// CPU decode (issue 19): the fused kernel (NOTE [fused decode] in
// kernels/cpu/fused_decode.hpp) against the ATen path of the same
// model in the same run, at 1 and 2 threads, on the 15M Llama shape (dim
// 288, 6 layers, vocab 32000, tied embeddings) and the 24M one (the same
// with an untied LM head). Each comparison interleaves the two paths over
// the rounds and keeps each side's best (the VM is shared and noisy).
// Also: the bytes of parameters read per token × tokens/s against a
// read-only streaming bandwidth measured here (not memcpy, which writes
// too); the model step alone (no engine scheduling or sampling); batch 32,
// whose steps read the packed copy of the weights (NOTE [packed panels];
// the engine packs: max_num_seqs 64), and its model step from the stored
// rows for comparison.
//
// Usage: bench_decode [rounds] [tokens]
#include "actors/inference/engine.hpp"
#include "bench/llama_shapes.hpp"
#include "kernels/cpu/fused_decode.hpp"
#include "models/llama.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

using namespace troupe;
using namespace troupe::actors::inference;
using clock_type = std::chrono::steady_clock;

namespace {

std::unique_ptr<engine> make(models::llama_model m) {
  engine_config c;
  c.num_blocks = 2048;
  c.max_num_seqs = 64;
  c.max_batched_tokens = 4096;
  auto e = engine::make(m, c);
  if (!e) {
    std::fprintf(stderr, "engine: %s\n", describe(e.error()).c_str());
    std::exit(1);
  }
  return std::move(*e);
}

// Generated tokens per second of `batch` greedy requests of `tokens` each
// after a 16-token prompt (the decode steps only: prefill excluded).
double decode_rate(engine& e, int batch, int tokens, int salt) {
  std::vector<generate_request> reqs;
  for (int r = 0; r < batch; ++r) {
    generate_request q;
    q.id = std::to_string(r);
    for (int i = 0; i < 16; ++i)
      q.prompt.push_back((i * 7919 + (r + salt) * 104729) % 32000);
    q.sampling.temperature = 0;
    q.sampling.max_tokens = tokens;
    q.sampling.ignore_eos = true;
    reqs.push_back(std::move(q));
  }
  auto before = e.metrics();
  auto t0 = clock_type::now();
  auto outs = e.generate(std::move(reqs));
  double wall = std::chrono::duration<double>(clock_type::now() - t0).count();
  if (!outs) {
    std::fprintf(stderr, "generate: %s\n", describe(outs.error()).c_str());
    std::exit(1);
  }
  auto after = e.metrics();
  // The first token of each request comes with its prefill step.
  double ttft_s = (after.mean_ttft_ms() > 0 ? after.mean_ttft_ms() : 0) / 1000.0;
  (void)before;
  return static_cast<double>(batch) * (tokens - 1) / std::max(1e-9, wall - ttft_s);
}

// Seconds per forward_paged of a decode step of `batch` requests, each one
// token at position 100 (the model step alone, without the engine's
// scheduling and sampling).
double model_step_seconds(models::llama_model& m, int steps, int64_t batch, int rounds = 3) {
  auto cache = m->make_paged_cache(16 * batch, 16);
  models::paged_batch b;
  auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  b.input_ids = torch::full({batch}, 7, i64);
  b.positions = torch::full({batch}, 100, i64);
  b.slot_mapping = torch::arange(batch, i64) * 256 + 100;
  b.block_tables = torch::arange(16 * batch, torch::kInt32).view({batch, 16});
  b.context_lens = torch::full({batch}, 101, i64);
  b.query_start = torch::arange(batch + 1, i64);
  double best = 1e9;
  for (int round = 0; round < rounds; ++round) {
    auto t0 = clock_type::now();
    for (int i = 0; i < steps; ++i)
      m->forward_paged(b, cache);
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - t0).count() / steps);
  }
  return best;
}

// Read-only streaming bandwidth (GB/s) of `threads` threads reading a
// 256 MiB buffer each pass (best of 5).
double read_bandwidth(int threads) {
  const size_t n = (256u << 20) / sizeof(float);
  std::vector<float> buf(n, 1.0f);
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    std::atomic<double> total{0};
    auto t0 = clock_type::now();
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; ++t)
      ts.emplace_back([&, t] {
        const float* p = buf.data() + n * t / threads;
        size_t len = n / threads;
        // The kernel's own dot product of the range with itself: one stream
        // of loads at the kernel's vector width (the second operand hits
        // the same lines).
        float s = kernels::cpu::dot(p, p, static_cast<int64_t>(len));
        total = total + s;
      });
    for (auto& t : ts)
      t.join();
    double dt = std::chrono::duration<double>(clock_type::now() - t0).count();
    if (total.load() > 0)
      best = std::max(best, static_cast<double>(n * sizeof(float)) / dt / 1e9);
  }
  return best;
}

struct pair_result {
  double fused = 0, aten = 0;
};

// Best tokens/s of each path at each thread count in `threads`. Every round
// runs all of them, in an order that alternates from round to round (the
// first run after a change of batch or threads is often the slower), so the
// ratios compare runs taken at the same time on this noisy machine.
std::vector<pair_result> compare(models::llama_model& m, engine& e, int batch, int tokens,
                                 int rounds, const std::vector<int>& threads) {
  std::vector<pair_result> best(threads.size());
  int salt = 0;
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < threads.size(); ++i) {
      auto t = r % 2 == 0 ? i : threads.size() - 1 - i;
      at::set_num_threads(threads[t]);
      for (int k = 0; k < 2; ++k) {
        bool fused = (r + k) % 2 == 0;
        m->set_fused_decode(fused);
        auto rate = decode_rate(e, batch, tokens, salt++);
        auto& slot = fused ? best[t].fused : best[t].aten;
        slot = std::max(slot, rate);
      }
    }
  m->set_fused_decode(true);
  return best;
}

} // namespace

int main(int argc, char** argv) {
  int rounds = argc > 1 ? std::max(1, std::atoi(argv[1])) : 3;
  int tokens = argc > 2 ? std::max(8, std::atoi(argv[2])) : 200;
  std::printf("machine: %u hardware threads; %d rounds, %d tokens per request (16-token prompt)\n",
              std::thread::hardware_concurrency(), rounds, tokens);
  double bw1 = read_bandwidth(1), bw2 = read_bandwidth(2);
  std::printf("read-only streaming bandwidth: %.2f GB/s (1 thread), %.2f GB/s (2 threads) = "
              "%.2fx\n",
              bw1, bw2, bw2 / bw1);
  for (bool tied : {true, false}) {
    torch::manual_seed(1);
    auto model = models::make_llama(bench::llama_shape(tied), models::head_kind::lm);
    if (!model)
      return 1;
    auto m = *model;
    m->eval();
    int64_t params = 0;
    for (const auto& p : m->parameters())
      params += p.numel();
    // Every weight is read once per token except an untied embedding table,
    // of which one row is.
    auto c = bench::llama_shape(tied);
    auto table = c.vocab_size * c.hidden_size;
    double bytes = 4.0 * static_cast<double>(tied ? params : params - table + c.hidden_size);
    auto e = make(m);
    std::printf("\n%.1fM parameters (%s embeddings), %.1f MB of them read per token\n",
                params / 1e6, tied ? "tied" : "untied", bytes / 1e6);
    auto by_threads = compare(m, *e, 1, tokens, rounds, {1, 2});
    for (int threads : {1, 2}) {
      const auto& r = by_threads[static_cast<size_t>(threads - 1)];
      double bw = threads == 1 ? bw1 : bw2;
      std::printf("  batch 1, %d thread%s: fused %.1f tokens/s, ATen %.1f tokens/s = %.2fx; "
                  "fused reads %.2f GB/s = %.0f%% of streaming\n",
                  threads, threads == 1 ? " " : "s", r.fused, r.aten, r.fused / r.aten,
                  bytes * r.fused / 1e9, 100 * bytes * r.fused / 1e9 / bw);
    }
    for (int threads : {1, 2}) {
      at::set_num_threads(threads);
      m->set_fused_decode(true);
      double fused = model_step_seconds(m, 100, 1);
      m->set_fused_decode(false);
      double aten = model_step_seconds(m, 100, 1);
      m->set_fused_decode(true);
      std::printf("  model step alone, %d thread%s: fused %.0f us, ATen %.0f us = %.2fx\n", threads,
                  threads == 1 ? " " : "s", 1e6 * fused, 1e6 * aten, aten / fused);
    }
    std::printf("  2-thread scaling: fused %.2fx, ATen %.2fx\n",
                by_threads[1].fused / by_threads[0].fused, by_threads[1].aten / by_threads[0].aten);
    auto b32 = compare(m, *e, 32, 64, std::max(2, rounds), {2})[0];
    std::printf("  batch 32, 2 threads: %.1f tokens/s (%.1f with fusing off) = %.2fx; batch 32 / "
                "batch 1 fused %.2fx, ATen %.2fx\n",
                b32.fused, b32.aten, b32.fused / b32.aten, b32.fused / by_threads[1].fused,
                b32.aten / by_threads[1].aten);
    {
      // Making the packed copy: one step that makes it minus one that reads
      // it, after the weights changed in place (as a weight load writes
      // them: the old copy's buffers are reused) and after a release.
      m->set_fused_decode(true);
      model_step_seconds(m, 1, 32);
      double reuse = model_step_seconds(m, 1, 32);
      double after_load = 1e9, after_release = 1e9;
      for (int i = 0; i < 3; ++i) {
        {
          torch::NoGradGuard no_grad;
          for (auto& p : m->parameters())
            p.mul_(1.0);
        }
        after_load = std::min(after_load, model_step_seconds(m, 1, 32, 1) - reuse);
        m->drop_decode_panels();
        after_release = std::min(after_release, model_step_seconds(m, 1, 32, 1) - reuse);
      }
      std::printf("  making the packed copy (%.1f MB): %.1f ms after a weight load, %.1f ms after "
                  "a release\n",
                  m->decode_panels_bytes() / 1e6, 1e3 * after_load, 1e3 * after_release);
      double fused = model_step_seconds(m, 20, 32);
      m->set_decode_panels(false);
      double rows = model_step_seconds(m, 20, 32);
      m->set_decode_panels(true);
      m->set_fused_decode(false);
      double aten = model_step_seconds(m, 20, 32);
      m->set_fused_decode(true);
      std::printf("  model step alone, batch 32, 2 threads: fused %.2f ms (%.2f ms from stored "
                  "rows), ATen %.2f ms = %.2fx\n",
                  1e3 * fused, 1e3 * rows, 1e3 * aten, aten / fused);
    }
  }
  return 0;
}
