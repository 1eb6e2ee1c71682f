#pragma once
// `troupe generate`: the inference engine on its own, over an HF model
// directory and a JSONL file of prompts (or one --prompt).

#include "actors/inference/engine.hpp"

#include <string>

namespace troupe::apps {

struct generate_options {
  std::string model_dir;
  std::string prompts_path; ///< JSONL: {"id"?: str, "prompt": str} or {"prompt_ids": [int]}
  std::string prompt;       ///< a single prompt instead of a file
  std::string output_path;  ///< JSONL results; empty = stdout
  actors::inference::sampling_params sampling;
  actors::inference::engine_config engine;
  bool print_metrics = true;
};

/// Runs generation; returns the process exit status (errors go to stderr).
int run_generate(const generate_options& options);

} // namespace troupe::apps
