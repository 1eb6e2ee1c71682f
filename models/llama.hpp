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

#include "kernels/cpu/decode_isa.hpp"
#include "models/config.hpp"
#include "models/pipeline_parallel.hpp"
#include "models/tensor_parallel.hpp"
#include "runtime/error.hpp"

#include <torch/torch.h>

#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace troupe::kernels::cpu {
class thread_team;
struct decode_model;
} // namespace troupe::kernels::cpu

namespace troupe::models {

/// Parses "lm" | "value" | "reward".
expected<head_kind> parse_head_kind(const std::string& name);

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

/// Paged KV storage for one model: per layer K and V pools [num_blocks,
/// block_size, n_kv, head_dim] in the model's dtype and device (NOTE [paged KV
/// layout] in kernels/paged_attention.hpp). Which blocks belong to which
/// request is the caller's business (the inference engine's block tables).
struct paged_kv_cache {
  std::vector<torch::Tensor> k, v;
  int64_t block_size = 16;
  int64_t num_blocks = 0;
};

/// One scheduled step over several requests (see kernels/paged_attention.hpp):
/// R requests, each with n_r >= 1 new tokens, concatenated into N rows.
/// input_ids and positions live on the model's device; the other tensors may
/// stay on the CPU (they are validated on the host every layer).
struct paged_batch {
  torch::Tensor input_ids;    // [N] int64
  torch::Tensor positions;    // [N] int64 absolute positions (RoPE)
  torch::Tensor slot_mapping; // [N] int64 where each new token's K/V is written
  torch::Tensor block_tables; // [R, max_blocks] int32
  torch::Tensor context_lens; // [R] int64, cached tokens including the new ones
  torch::Tensor query_start;  // [R+1] int64
};

struct packed_decode_weights;

/// NOTE [layer hooks]: the seam where a strategy that shards the parameters
/// at rest (zero3: NOTE [training strategies] in
/// actors/train/training_strategy.hpp) takes part in the model's passes.
/// forward() calls begin_forward first (the parameters outside the layers
/// made whole) and, when no backward can follow (grad mode off), end_forward
/// last; each layer runs as run_layer(i, x, fn), where fn computes the layer
/// on its input with whatever the layer's parameters are when it is called
/// (it holds copies of the pass's masks and rotary tables, so it may be
/// called again during backward). Not with a KV cache: a layer run again
/// would append twice.
class layer_hooks {
public:
  virtual ~layer_hooks() = default;
  virtual void begin_forward() = 0;
  virtual void end_forward() = 0;
  virtual torch::Tensor run_layer(size_t layer, const torch::Tensor& x,
                                  std::function<torch::Tensor(const torch::Tensor&)> fn) = 0;
};

class llama_model_impl : public torch::nn::Module {
public:
  /// Builds a randomly initialised model (normal(0, 0.02) weights, unit norms,
  /// zero biases). Call validate(config) first; this constructor assumes it.
  /// With an active `tp`, the model holds that rank's parts and its passes
  /// take part in the group's collectives (NOTE [tensor parallelism] in
  /// models/tensor_parallel.hpp); the group must outlive the model. With an
  /// active `pp`, it holds that stage's layers (and the embedding on the
  /// first, the norm and head on the last: NOTE [pipeline parallelism] in
  /// models/pipeline_parallel.hpp) and runs forward_stage only.
  llama_model_impl(const llama_config& config, head_kind head, tp_partition tp = {},
                   pp_stage pp = {});

  const llama_config& config() const { return config_; }
  head_kind head() const { return head_; }
  /// This rank's tensor-parallel share (inactive: the whole model).
  const tp_partition& tp() const { return tp_; }
  /// This rank's pipeline stage (inactive: every layer).
  const pp_stage& pp() const { return pp_; }

  /// Final-norm hidden states [B, T, hidden]. `attention_mask` [B, T] may be
  /// undefined (all real). With a cache, the new tokens are appended to it and
  /// attend to every cached real token.
  torch::Tensor hidden_states(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                              kv_cache* cache = nullptr);

  /// The head's output: logits [B, T, V] (lm; under TP this rank's part of
  /// the vocabulary, [B, T, tp().vocab]), values [B, T] (value), or scores
  /// [B] (reward, at each row's last real token).
  torch::Tensor forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                        kv_cache* cache = nullptr);

  /// A pipeline stage's part of forward (NOTE [pipeline parallelism]):
  /// `input` is the previous stage's output [B, T, hidden] (undefined on the
  /// first stage, which embeds `input_ids`); answers the head's output on
  /// the last stage, else this stage's hidden states for the next. Without
  /// PP it is forward().
  torch::Tensor forward_stage(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                              const torch::Tensor& input);

  /// Applies the head to hidden states (for callers that slice first).
  torch::Tensor apply_head(const torch::Tensor& hidden, const torch::Tensor& attention_mask);

  /// An empty cache for `batch` rows and `capacity` tokens on this model's
  /// device and dtype.
  kv_cache make_cache(int64_t batch, int64_t capacity) const;

  /// Zeroed paged KV pools for every layer on this model's device and dtype.
  paged_kv_cache make_paged_cache(int64_t num_blocks, int64_t block_size) const;

  /// One paged step (lm head only; no autograd): writes the new tokens' K/V
  /// at batch.slot_mapping, attends through the block tables, and returns
  /// logits [M, V] for the token rows `logit_rows` ([M] int64 indices into N;
  /// default: the last new token of each request, M = R). Throws c10::Error
  /// on bad input; run_forward_paged returns errors as values.
  torch::Tensor forward_paged(const paged_batch& batch, paged_kv_cache& cache,
                              const torch::Tensor& logit_rows = {});

  /// Parameters by troupe name ("layers.0.attention.wq.weight", ...).
  std::map<std::string, torch::Tensor> named_weights() const;

  /// The strategy's hooks into forward (NOTE [layer hooks]; null: none). The
  /// hooks must outlive the model's passes.
  void set_layer_hooks(layer_hooks* hooks) { hooks_ = hooks; }

  /// How forward_paged runs decode steps (one new token per request) of fp32
  /// lm models on the CPU: through the fused kernel (NOTE [fused decode] in
  /// kernels/cpu/fused_decode.hpp), the per-operator ATen path, or (auto,
  /// the default) whichever the crossover table says wins at the step's
  /// batch size (NOTE [decode crossovers] in kernels/cpu/decode_isa.hpp).
  void set_decode_path(kernels::cpu::decode_path path) { decode_path_ = path; }
  kernels::cpu::decode_path decode_path() const { return decode_path_; }

  /// The fused kernel's instruction-set path (NOTE [decode isa]; default
  /// auto). Throws std::invalid_argument for one this CPU lacks.
  void set_decode_isa(kernels::cpu::decode_isa isa);
  kernels::cpu::decode_isa decode_isa() const { return decode_isa_; }

  /// Whether fused decode steps of more than one request read a packed copy
  /// of the weights (NOTE [packed panels] in kernels/cpu/fused_decode.hpp):
  /// auto where the crossover table says, on at every such step, off never
  /// (the default: it costs a second copy of the weights). The copy is made
  /// at the first step that reads it, and made again after the weights
  /// change (assign_hf_weights, or any in-place write LibTorch counts) or
  /// the path does; off frees it.
  void set_decode_panels(kernels::cpu::panels_mode mode);
  kernels::cpu::panels_mode decode_panels() const { return decode_panels_; }
  /// Bytes of the packed copy now (0 when none is made).
  int64_t decode_panels_bytes() const;
  /// Drops the packed copy (the weights were written where LibTorch cannot
  /// see it, or its memory is wanted); the next batched step makes it again.
  void drop_decode_panels();

  /// Whether forward_paged runs through the batch-invariant kernels (NOTE
  /// [batch-invariant forward] in models/batch_invariant.hpp): a token's
  /// logits then have the same bits whatever else the step holds, at some
  /// cost in speed. Off by default.
  void set_batch_invariant(bool on) { batch_invariant_ = on; }
  bool batch_invariant() const { return batch_invariant_; }

  /// NOTE [decode path report]: how the last forward_paged ran, for the
  /// engine's metrics: whether it had decode rows (one new token of a request;
  /// NOTE [mixed steps]), whether the fused kernel ran them, and when not, why.
  struct decode_report {
    bool decode = false;
    bool fused = false;
    const char* why = ""; // static text
  };
  decode_report last_decode() const { return last_decode_; }

private:
  /// Embedding rows of `ids` (vocab-parallel under TP).
  torch::Tensor embed(const torch::Tensor& ids);
  /// The stage's layers over `x` (positions and key mask from `input_ids`
  /// and `attention_mask`; with a cache, appending to it).
  torch::Tensor run_layers(torch::Tensor x, const torch::Tensor& input_ids,
                           const torch::Tensor& attention_mask, kv_cache* cache);
  /// A parameter of the model (its dtype and device are the model's).
  torch::Tensor any_weight() const;
  /// The fused kernel's logits [N, V] for a decode step it can run (one
  /// token per request, fp32 weights on the CPU), else an undefined tensor.
  torch::Tensor fused_step(const paged_batch& batch, paged_kv_cache& cache,
                           const torch::Tensor& logit_rows);
  /// The storage and LibTorch's count of in-place writes of each tensor the
  /// fused kernel reads, in decode_view's order.
  using weight_state = std::vector<std::pair<const void*, int64_t>>;
  /// The kernel's view of the weights and of `cache`'s pools, and their
  /// state; nullopt unless every tensor it reads is the kernel's (fp32,
  /// CPU, dense). Touches only those tensors: a step cannot afford
  /// walking the module tree (parameters() took ~50 us, 3 % of a step).
  std::optional<kernels::cpu::decode_model> decode_view(paged_kv_cache& cache,
                                                        weight_state& state);
  /// The packed copy of the weights in `state` (made again when the
  /// weights changed since). The caller holds team_mu_.
  const packed_decode_weights& packed_weights(const weight_state& state);

  llama_config config_;
  head_kind head_;
  tp_partition tp_;
  pp_stage pp_;
  int64_t cached_kv_heads_ = 0; // key / value heads a layer's cache holds on this rank
  torch::nn::Embedding tok_embeddings_{nullptr};
  torch::nn::ModuleList layers_{nullptr};
  std::shared_ptr<torch::nn::Module> norm_;
  torch::nn::Linear output_{nullptr};     // lm head when untied
  torch::nn::Linear score_head_{nullptr}; // value or reward head
  kernels::cpu::decode_path decode_path_ = kernels::cpu::decode_path::automatic;
  kernels::cpu::decode_isa decode_isa_ = kernels::cpu::decode_isa::automatic;
  kernels::cpu::panels_mode decode_panels_ = kernels::cpu::panels_mode::off;
  // The packed copy and the parameters' state it was made from.
  std::shared_ptr<packed_decode_weights> panels_;
  // The fused kernel's threads, and who runs them: a second caller at the
  // same time (two engines on one model) takes the ATen path instead.
  std::shared_ptr<kernels::cpu::thread_team> team_;
  std::shared_ptr<std::mutex> team_mu_ = std::make_shared<std::mutex>();
  /// Fused steps run (under team_mu_): NOTE [alternating head order].
  uint64_t fused_steps_ = 0;
  decode_report last_decode_;
  bool batch_invariant_ = false;
  layer_hooks* hooks_ = nullptr;
};
TORCH_MODULE_IMPL(llama_model, llama_model_impl);

/// Builds a model after validating the config (with `tp`, rank tp.rank's
/// share of it; with `pp`, stage pp.rank's layers).
expected<llama_model> make_llama(const llama_config& config, head_kind head, tp_partition tp = {},
                                 pp_stage pp = {});

/// A rank's part of `dense` (NOTE [tensor parallelism], NOTE [pipeline
/// parallelism]): a model of the same config and head built for `tp` and
/// `pp` whose parameters are copies of dense's parts (tp_slice_of) on the
/// stage. Active ones need their groups.
expected<llama_model> make_model_part(const llama_model& dense, const tp_partition& tp,
                                      const pp_stage& pp = {});

/// Safe wrapper of forward(): shape/dtype errors come back as errors.
expected<torch::Tensor> run_forward(llama_model& model, const torch::Tensor& input_ids,
                                    const torch::Tensor& attention_mask, kv_cache* cache = nullptr);

/// Safe wrapper of forward_paged(): bad batches come back as errors with the
/// kernels' codes (shape_mismatch, out_of_range, ...).
expected<torch::Tensor> run_forward_paged(llama_model& model, const paged_batch& batch,
                                          paged_kv_cache& cache,
                                          const torch::Tensor& logit_rows = {});

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
/// The same with the weights already exported (export_hf_weights' names),
/// e.g. gathered a unit at a time by a sharded trainer.
expected<void> save_exported(const llama_model& model, const std::string& dir,
                             const std::map<std::string, torch::Tensor>& hf_tensors,
                             uint64_t max_shard_bytes = 0);

} // namespace troupe::models
