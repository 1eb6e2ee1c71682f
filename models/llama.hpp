#pragma once
// Llama-family decoder (Llama 2/3, Qwen2, Mistral shapes) in LibTorch:
// RMSNorm, rotary position embeddings (HF rotate-half convention, theta from
// the config), SwiGLU MLP, grouped-query attention, optional q/k/v/o biases,
// tied or untied embeddings, and one head: language model, per-token value
// (critic) or scalar reward (score at the last non-pad token).
//
// NOTE [padding and positions]: every forward takes an attention mask [B, T]
// (1 = real token, 0 = pad). Prompts may be left-padded and responses
// right-padded in the same row; position ids are the running count of real
// tokens (cumsum(mask) - 1), so a row's real tokens get positions 0, 1, ...
// whatever padding surrounds them. Pad positions produce finite garbage that
// callers mask out.

#include "models/config.hpp"
#include "runtime/error.hpp"

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

namespace troupe::models {

/// Which head sits on top of the decoder.
enum class head_kind {
  /// Vocabulary logits [B, T, V] (policy, reference).
  lm,
  /// One scalar per token [B, T] (critic); HF: *ForTokenClassification, 1 label.
  value,
  /// One scalar per sequence [B] at the last real token (reward model);
  /// HF: *ForSequenceClassification, 1 label.
  reward,
};

/// Parses "lm" | "value" | "reward".
expected<head_kind> parse_head_kind(const std::string& name);
std::string to_string(head_kind kind);

/// Contiguous per-layer key/value cache for incremental decoding.
/// Owned by one caller at a time; not thread-safe.
struct kv_cache {
  /// Per layer: [B, n_kv_heads, capacity, head_dim].
  std::vector<torch::Tensor> keys;
  std::vector<torch::Tensor> values;
  /// [B, capacity] bool: which filled slots hold real (non-pad) tokens.
  torch::Tensor key_mask;
  /// [B] int64: position id of the next real token of each row.
  torch::Tensor next_position;
  /// Number of filled slots (same for every row).
  int64_t length = 0;
  int64_t capacity = 0;
};

class llama_model_impl : public torch::nn::Module {
public:
  /// Builds a randomly initialised model (normal(0, 0.02) weights, unit norms,
  /// zero biases). Call validate(config) first; this constructor assumes it.
  llama_model_impl(const llama_config& config, head_kind head);

  const llama_config& config() const { return config_; }
  head_kind head() const { return head_; }

  /// Final-norm hidden states [B, T, hidden]. `attention_mask` [B, T] may be
  /// undefined (all real). With a cache, the new tokens are appended to it and
  /// attend to every cached real token.
  torch::Tensor hidden_states(const torch::Tensor& input_ids,
                              const torch::Tensor& attention_mask,
                              kv_cache* cache = nullptr);

  /// The head's output: logits [B, T, V] (lm), values [B, T] (value), or
  /// scores [B] (reward, at each row's last real token).
  torch::Tensor forward(const torch::Tensor& input_ids,
                        const torch::Tensor& attention_mask,
                        kv_cache* cache = nullptr);

  /// Applies the head to hidden states (for callers that slice first).
  torch::Tensor apply_head(const torch::Tensor& hidden, const torch::Tensor& attention_mask);

  /// An empty cache for `batch` rows and `capacity` tokens on this model's
  /// device and dtype.
  kv_cache make_cache(int64_t batch, int64_t capacity) const;

  /// Parameters by troupe name ("layers.0.attention.wq.weight", ...).
  std::map<std::string, torch::Tensor> named_weights() const;

private:
  llama_config config_;
  head_kind head_;
  torch::nn::Embedding tok_embeddings_{nullptr};
  torch::nn::ModuleList layers_{nullptr};
  std::shared_ptr<torch::nn::Module> norm_;
  torch::nn::Linear output_{nullptr};     // lm head when untied
  torch::nn::Linear score_head_{nullptr}; // value or reward head
};
TORCH_MODULE_IMPL(llama_model, llama_model_impl);

/// Builds a model after validating the config.
expected<llama_model> make_llama(const llama_config& config, head_kind head);

/// Safe wrapper of forward(): shape/dtype errors come back as errors.
expected<torch::Tensor> run_forward(llama_model& model, const torch::Tensor& input_ids,
                                    const torch::Tensor& attention_mask,
                                    kv_cache* cache = nullptr);

// ---- weight names ---------------------------------------------------------

/// HF transformers name of a troupe parameter name ("tok_embeddings.weight"
/// -> "model.embed_tokens.weight"), or not_found for an unknown name.
expected<std::string> to_hf_name(const std::string& troupe_name, head_kind head);
/// troupe name of an HF name, or not_found.
expected<std::string> from_hf_name(const std::string& hf_name, head_kind head);

/// The HF architecture string for a config's family and a head
/// (LlamaForCausalLM, Qwen2ForTokenClassification, ...).
std::string hf_architecture(const llama_config& config, head_kind head);

/// Copies HF-named tensors into the model (dtype converted to the model's).
/// Strict: a missing or unexpected tensor, or a shape mismatch, is an error
/// naming it. `lm_head.weight` may be absent when embeddings are tied; a
/// checkpoint without a value/reward head leaves a fresh head (allowed only
/// when `allow_missing_head`, e.g. a critic initialised from a policy).
expected<void> assign_hf_weights(llama_model& model,
                               const std::map<std::string, torch::Tensor>& hf_tensors,
                               bool allow_missing_head = false);

/// The model's parameters under HF names (contiguous CPU copies), ready to be
/// written as a checkpoint that HF transformers loads.
std::map<std::string, torch::Tensor> export_hf_weights(const llama_model& model);

/// Loads an HF directory (config.json + *.safetensors, sharded or not).
expected<llama_model> load_pretrained(const std::string& dir, head_kind head,
                                      bool allow_missing_head = false);
/// Saves config.json + model.safetensors (shards above `max_shard_bytes` > 0).
expected<void> save_pretrained(const llama_model& model, const std::string& dir,
                               uint64_t max_shard_bytes = 0);

} // namespace troupe::models
