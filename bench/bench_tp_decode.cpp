// The tensor-parallel rollout engine's decode against the single-rank
// engine at equal total threads (NOTE [tensor-parallel decode] in
// models/llama.cpp): the 24M shape with random weights, greedy requests of
// 64 new tokens at batch 1, 8 and 32; the single engine on 2 threads, TP 2
// as two in-process gloo ranks of 1 thread each (the fused kernel on each
// rank's part, NOTE [tensor-parallel fused decode], and the ATen path).
// Prints tokens/s and the ratio to the single engine, and checks the TP
// ranks' tokens equal the single engine's.
//
//   bench_tp_decode [--quick] [--only BATCH] [--reps N]
//   (--only: that batch, fused with shm sums; --reps: pairs of runs behind the
//   fused-with-shm ratio, its median printed, default 3)
#include "actors/inference/engine.hpp"
#include "bench/llama_shapes.hpp"
#include "models/llama.hpp"
#include "models/tensor_parallel.hpp"
#include "runtime/collectives.hpp"
#include "runtime/shm_collectives.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <vector>

using namespace troupe;
using actors::inference::engine;
using actors::inference::engine_config;
using actors::inference::generate_request;
using actors::inference::request_output;
using kernels::cpu::decode_path;

namespace {

std::vector<generate_request> requests(int batch, int tokens, int64_t vocab) {
  std::vector<generate_request> out;
  for (int i = 0; i < batch; ++i) {
    generate_request r;
    r.id = "r" + std::to_string(i);
    for (int t = 0; t < 8; ++t)
      r.prompt.push_back(1 + (97 * i + 31 * t) % (vocab - 1));
    r.sampling.temperature = 0;
    r.sampling.max_tokens = tokens;
    r.sampling.ignore_eos = true;
    out.push_back(std::move(r));
  }
  return out;
}

engine_config config_for(int batch) {
  engine_config c;
  c.block_size = 16;
  c.max_num_seqs = batch;
  c.expected_sequences = batch;
  c.expected_tokens = 8 + 64;
  return c;
}

struct run_result {
  double tokens_per_s = 0;
  std::vector<request_output> outputs;
};

// Generates on `model` (a whole model or a rank's part); tokens per second
// of the second of two runs (the first warms the pools and the panels).
run_result generate_on(models::llama_model model, int batch, int tokens, decode_path path) {
  model->set_decode_path(path);
  auto e = engine::make(model, config_for(batch));
  if (!e) {
    std::fprintf(stderr, "%s\n", describe(e.error()).c_str());
    std::exit(1);
  }
  run_result r;
  for (int round = 0; round < 2; ++round) {
    auto reqs = requests(batch, tokens, model->config().vocab_size);
    for (auto& q : reqs)
      q.id += "-" + std::to_string(round);
    const auto t0 = std::chrono::steady_clock::now();
    auto outs = (*e)->generate(reqs);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!outs) {
      std::fprintf(stderr, "%s\n", describe(outs.error()).c_str());
      std::exit(1);
    }
    r.tokens_per_s = static_cast<double>(batch * tokens) / s;
    r.outputs = std::move(*outs);
  }
  return r;
}

// TP 2: two ranks in this process, one compute thread each.
run_result generate_tp(const models::llama_model& dense, int tp, int batch, int tokens,
                       decode_path path, bool shm) {
  runtime::group_options go;
  go.name = "tp-decode-" + std::to_string(batch) + "-" + std::string{to_string(path)} +
            (shm ? "-shm" : "");
  go.timeout_ms = 120000;
  auto world = runtime::make_local_groups(tp, go);
  if (!world) {
    std::fprintf(stderr, "%s\n", describe(world.error()).c_str());
    std::exit(1);
  }
  std::vector<std::future<run_result>> ranks;
  for (int r = 0; r < tp; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto g = std::move(world->groups[static_cast<size_t>(r)]);
      if (shm) { // NOTE [shm all-reduce]
        auto wrapped = runtime::with_shm_collectives(
            std::move(g), world->stores[static_cast<size_t>(r)], go.name, int64_t{4} << 20);
        if (!wrapped) {
          std::fprintf(stderr, "%s\n", describe(wrapped.error()).c_str());
          std::exit(1);
        }
        g = std::move(*wrapped);
      }
      auto part = models::partition_llama(dense->config(), g);
      auto model = part ? models::make_model_part(dense, *part)
                        : expected<models::llama_model>{part.error()};
      if (!model) {
        std::fprintf(stderr, "%s\n", describe(model.error()).c_str());
        std::exit(1);
      }
      return generate_on(*model, batch, tokens, path);
    }));
  std::vector<run_result> results;
  for (auto& f : ranks)
    results.push_back(f.get());
  double slowest = results.front().tokens_per_s;
  for (const auto& r : results)
    slowest = std::min(slowest, r.tokens_per_s);
  results.front().tokens_per_s = slowest;
  return results.front();
}

bool same_tokens(const std::vector<request_output>& a, const std::vector<request_output>& b) {
  if (a.size() != b.size())
    return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].samples.front().tokens != b[i].samples.front().tokens)
      return false;
  return true;
}

} // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int only = 0; // a profiling run: one batch size, the fused path with shm sums
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0)
      quick = true;
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc)
      only = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
  }
  const int tokens = quick ? 8 : 64;
  torch::manual_seed(5);
  auto shape = bench::shape_24m();
  auto dense = models::make_llama(shape, models::head_kind::lm);
  if (!dense) {
    std::fprintf(stderr, "%s\n", describe(dense.error()).c_str());
    return 1;
  }
  (*dense)->eval();
  std::printf("tensor-parallel decode, 24M shape, greedy, %d new tokens a request; single engine "
              "at 2 threads, tp 2 as 2 ranks of 1 thread\n",
              tokens);
  std::printf("%-6s %-22s %10s %10s %8s %s\n", "batch", "path", "single t/s", "tp 2 t/s", "ratio",
              "tokens");
  bool ok = true;
  auto row = [&](int batch, const std::string& how, const run_result& single, const run_result& tp,
                 const std::string& note) {
    const bool equal = same_tokens(single.outputs, tp.outputs);
    ok = ok && equal;
    std::printf("%-6d %-22s %10.0f %10.0f %8.2f %s%s\n", batch, how.c_str(), single.tokens_per_s,
                tp.tokens_per_s, tp.tokens_per_s / single.tokens_per_s, equal ? "equal" : "DIFFER",
                note.c_str());
  };
  auto single_on = [&](int batch) {
    at::set_num_threads(2);
    auto r = generate_on(*dense, batch, tokens, decode_path::automatic);
    at::set_num_threads(1);
    return r;
  };
  for (int batch : {1, 8, 32}) {
    if (only > 0 && batch != only)
      continue;
    // The figure, fused with shm sums: `reps` pairs of runs, each
    // TP run right after its single-engine baseline; the median ratio.
    std::vector<double> ratios;
    run_result single, tp;
    std::string each;
    for (int rep = 0; rep < reps; ++rep) {
      single = single_on(batch);
      tp = generate_tp(*dense, 2, batch, tokens, decode_path::fused, true);
      ratios.push_back(tp.tokens_per_s / single.tokens_per_s);
      char x[16];
      std::snprintf(x, sizeof x, "%s%.2f", each.empty() ? "" : " / ", ratios.back());
      each += x;
      ok = ok && same_tokens(single.outputs, tp.outputs);
    }
    std::sort(ratios.begin(), ratios.end());
    char median[64];
    std::snprintf(median, sizeof median, "  median of %d pairs %.2f (", reps,
                  ratios[ratios.size() / 2]);
    row(batch, "fused, shm sums", single, tp, median + each + ")");
    if (only > 0)
      continue;
    for (bool shm : {true, false})
      for (auto path : {decode_path::fused, decode_path::aten})
        if (!shm || path != decode_path::fused) // the pairs above ran fused with shm
          row(batch,
              std::string{path == decode_path::fused ? "fused" : "aten"} +
                  (shm ? ", shm sums" : ", gloo sums"),
              single, generate_tp(*dense, 2, batch, tokens, path, shm), "");
  }
  return ok ? 0 : 1;
}
