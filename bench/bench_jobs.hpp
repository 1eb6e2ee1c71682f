#pragma once
// The RL job the placement benchmarks run (bench_placement,
// bench_recovery): the sort task, stages [rl], a model of `hidden` ×
// `layers`, 8 prompts × 2 samples of 8 tokens an iteration, no evaluation
// or checkpoints, the critic from the base model, a 256 MiB KV pool.

#include "actors/rl/job_config.hpp"
#include "runtime/config.hpp"

#include <string>
#include <vector>

namespace troupe::bench {

inline std::string placed_job_yaml(const std::string& dir, int iterations, int hidden, int layers) {
  return "run: {dir: '" + dir +
         "', seed: 5, progress: none}\n"
         "stages: [rl]\n"
         "data: {task: sort, min_digits: 3, max_digits: 5, train_size: 256, eval_size: 8}\n"
         "model: {hidden_size: " +
         std::to_string(hidden) + ", intermediate_size: " + std::to_string(hidden * 8 / 3) +
         ", num_layers: " + std::to_string(layers) +
         ", num_heads: 8, num_kv_heads: 8, max_position_embeddings: 64}\n"
         "rl:\n"
         "  iterations: " +
         std::to_string(iterations) +
         "\n"
         "  prompts_per_iteration: 8\n"
         "  samples_per_prompt: 2\n"
         "  minibatches: 2\n"
         "  eval_every: 0\n"
         "  eval_samples: 1\n"
         "  checkpoint_every: 0\n"
         "  critic: {init: base}\n"
         "  generation: {max_tokens: 8}\n"
         "  rollout: {kv_cache_mb: 256}\n";
}

/// `yaml` with each "key=value" of `sets` applied, loaded and checked.
inline expected<actors::rl::job_config> load_bench_job(const std::string& yaml,
                                                       const std::vector<std::string>& sets) {
  auto doc = runtime::yaml_document::from_text(yaml, "bench.yaml");
  if (!doc)
    return doc.error();
  for (const auto& x : sets)
    if (auto ok = doc->set(x); !ok)
      return ok.error();
  return runtime::load_config<actors::rl::job_config>(*doc);
}

} // namespace troupe::bench
