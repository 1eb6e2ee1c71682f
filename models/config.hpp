#pragma once
// The decoder configuration and its import from / export to Hugging Face
// config.json files (Llama, Qwen2 and Mistral families; causal LM, sequence-
// and token-classification heads).

#include "kernels/cpu/decode_isa.hpp"
#include "runtime/enum_names.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe::models {

/// Which head sits on top of the decoder.
enum class head_kind : uint8_t {
  /// Vocabulary logits [B, T, V] (policy, reference).
  lm,
  /// One scalar per token [B, T] (critic); HF: *ForTokenClassification, 1 label.
  value,
  /// One scalar per sequence [B] at the last real token (reward model);
  /// HF: *ForSequenceClassification, 1 label.
  reward,
};
TROUPE_ENUM_NAMES(head_kind, "lm", "value", "reward")

/// RoPE frequency scaling (HF "rope_scaling"). Supported types: "linear"
/// (every frequency divided by `factor`) and "llama3" (Llama 3.1/3.2).
struct rope_scaling_config {
  std::string rope_type = "llama3";
  double factor = 1.0;
  /// llama3 only.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;

  bool operator==(const rope_scaling_config&) const = default;
};

/// A Llama-style decoder (Llama 2/3, Qwen2, Mistral without sliding window).
struct llama_config {
  /// HF architecture: family Llama / Qwen2 / Mistral + ForCausalLM,
  /// ForSequenceClassification (reward) or ForTokenClassification (value).
  std::string architecture = "LlamaForCausalLM";
  int64_t vocab_size = 32000;
  int64_t hidden_size = 288;
  int64_t intermediate_size = 768;
  int64_t num_hidden_layers = 6;
  int64_t num_attention_heads = 6;
  int64_t num_key_value_heads = 6;
  int64_t head_dim = 0; // 0 = hidden_size / num_attention_heads
  int64_t max_position_embeddings = 256;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;               // Qwen2: true; Llama attention_bias: true
  bool o_bias = false;                 // Llama attention_bias: true; Qwen2: false
  bool mlp_bias = false;               // Llama mlp_bias
  std::string torch_dtype = "float32"; // "float32", "float16" or "bfloat16"
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids; // HF eos_token_id may be an int or a list
  std::optional<int64_t> pad_token_id;
  std::optional<rope_scaling_config> rope_scaling;

  /// head_dim, or hidden_size / num_attention_heads when head_dim is 0.
  int64_t resolved_head_dim() const;

  bool operator==(const llama_config&) const = default;
};

/// Parses and validates the text of a HF config.json; errors start with
/// `source_name` and name the offending key.
expected<llama_config> parse_hf_config(const std::string& json_text,
                                       const std::string& source_name);

/// Reads, parses and validates a config.json file.
expected<llama_config> load_hf_config(const std::string& path);

/// The config.json that HF transformers loads for `c` (model_type,
/// architectures and every field above under its HF name).
std::string to_hf_config_json(const llama_config& c);

/// Cross-field checks (positive sizes, head divisibility, even head_dim,
/// biases the architecture can express, ...); collects every violation into
/// one invalid_config / unsupported error that names the keys.
expected<void> validate(const llama_config& c);

/// Bytes of the packed copy of an fp32 lm model's weights that fused CPU
/// decode steps of several requests read (llama_model_impl::set_decode_panels),
/// packed for the instruction-set path `isa`.
int64_t decode_panels_bytes(const llama_config& c,
                            kernels::cpu::decode_isa isa = kernels::cpu::decode_isa::automatic);

/// The RoPE inverse frequencies theta^(-2i/d) for i in [0, d/2), with
/// rope_scaling applied (d = resolved_head_dim()).
std::vector<double> rope_inv_freq(const llama_config& c);

} // namespace troupe::models
