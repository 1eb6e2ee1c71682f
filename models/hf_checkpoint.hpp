#pragma once
// Hugging Face checkpoint directories in terms of HF tensor names:
//   config.json
//   model.safetensors                          (one file), or
//   model-00001-of-0000N.safetensors ...       (shards) plus
//   model.safetensors.index.json               {"metadata": {"total_size": B},
//                                               "weight_map": {name: shard file}}
// Mapping HF names to troupe module names is the model's business.

#include "models/config.hpp"
#include "runtime/error.hpp"
#include "runtime/safetensors.hpp"

#include <cstdint>
#include <string>

namespace troupe::models {

// The safetensors format lives in runtime/ (weight transports use it too).
using runtime::load_safetensors;
using runtime::save_safetensors;
using runtime::string_map;
using runtime::tensor_map;

/// File names used inside a checkpoint directory.
inline constexpr const char* hf_config_file = "config.json";
inline constexpr const char* hf_weights_file = "model.safetensors";
inline constexpr const char* hf_index_file = "model.safetensors.index.json";

/// A loaded HF checkpoint: its config and its tensors under HF names.
struct hf_checkpoint {
  llama_config config;
  tensor_map tensors;
};

/// Loads the safetensors weights of `dir` (model.safetensors, else the shards
/// of model.safetensors.index.json), checking the index against the shards;
/// `target` names tensors to read into in place (runtime::load_safetensors).
expected<tensor_map> load_hf_weights(const std::string& dir, const runtime::tensor_target& target = {});

/// Loads config.json and the weights of `dir`.
expected<hf_checkpoint> load_hf_checkpoint_dir(const std::string& dir);

/// Writes the weights into `dir` (created if missing): one model.safetensors
/// when `max_shard_bytes` is 0 or everything fits, else shards of at most
/// `max_shard_bytes` (a larger tensor gets a shard of its own) and the index.
/// Every file carries "__metadata__": {"format": "pt"} and is written atomically;
/// a stale index or single file of the other layout is removed.
expected<void> save_hf_weights(const std::string& dir, const tensor_map& tensors,
                               uint64_t max_shard_bytes = 0);

/// Validates `config`, writes config.json and the weights into `dir`.
expected<void> save_hf_checkpoint_dir(const std::string& dir, const llama_config& config,
                                      const tensor_map& tensors, uint64_t max_shard_bytes = 0);

} // namespace troupe::models
