#pragma once
// The inference engine core: continuous batching over a paged KV cache with
// prefix sharing, sampling with per-token log-probs, and in-place weight
// updates. A plain class (no actor system): the rollout actor wraps it and
// `troupe generate` drives it directly. Single-threaded: one owner calls it.
//
// NOTE [engine step]: each step() (1) makes room for every running sequence's
// next token (allocating a block, copying a shared partly-filled block first,
// or preempting the most recently admitted sequence when the pool is empty),
// (2) admits waiting sequences in arrival order while the running limit, the
// per-step token budget and free blocks allow (long prompts are prefilled in
// chunks), (3) runs one batched forward over all scheduled tokens, (4) samples
// for every sequence whose tokens are all computed, and (5) retires finished
// requests at once. The n samples of a request are forked from the first
// sample after its prompt is computed: they share every prompt block and
// sample their first tokens from the same logits with their own streams.

#include "actors/inference/sampler.hpp"
#include "kernels/cpu/decode_isa.hpp"
#include "models/config.hpp"
#include "runtime/enum_names.hpp"
#include "runtime/error.hpp"
#include "runtime/wire_float.hpp"

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace at {
class Tensor;
} // namespace at

namespace troupe::models {
class llama_model;
} // namespace troupe::models

namespace troupe::models {
struct tp_partition;
}

namespace troupe::actors::inference {

/// Whether decode steps read a packed copy of the weights (NOTE [decode
/// panels]), and on which instruction-set path the CPU decode runs (NOTE
/// [decode isa] in kernels/cpu/decode_isa.hpp).
using kernels::cpu::panels_mode;
using isa_mode = kernels::cpu::decode_isa;

/// NOTE [in-flight update]: what a weight version loaded while sequences
/// run does to their K/V. keep: they continue on the K/V computed so far
/// (under the versions before) and sample on with the new weights — no
/// token is computed twice, each generated token tagged with the version
/// that sampled it (sample_output::versions). recompute: they go back to
/// the waiting queue and their K/V is computed again under the new weights
/// (a continuation exactly as the new weights would give it). Either way
/// the prefix cache is cleared, and a sequence whose K/V mixes versions
/// never enters it.
enum class update_kv : uint8_t { keep, recompute };
TROUPE_ENUM_NAMES(update_kv, "keep", "recompute")

struct engine_config {
  /// Tokens per KV block.
  int64_t block_size = 16;
  /// KV blocks in the pool; 0 = sized to the work (NOTE [kv pool size]).
  int64_t num_blocks = 0;
  /// The KV pool's cap when num_blocks is 0 (MiB, all layers, K and V).
  double kv_cache_mb = 256;
  /// Running sequences at most.
  int64_t max_num_seqs = 64;
  /// Tokens computed per step at most (prefill chunks + decodes).
  int64_t max_batched_tokens = 2048;
  /// Prompt + generation limit; 0 = the model's max_position_embeddings.
  int64_t max_model_len = 0;
  /// Reuse the KV of cached prompt prefixes (radix tree over token ids).
  bool enable_prefix_caching = true;
  /// Seed sequence for requests that carry no seed.
  uint64_t seed = 0;
  /// The work the caller expects, for sizing the KV pool (not job keys:
  /// callers derive them): sequences alive at once, and tokens (prompt +
  /// generation) of the longest; 0 = unknown (max_num_seqs / the context).
  int64_t expected_sequences = 0;
  int64_t expected_tokens = 0;
  /// NOTE [decode panels]: decode steps of several requests on an fp32 CPU
  /// model can read a packed second copy of the weights (NOTE [packed
  /// panels] in kernels/cpu/fused_decode.hpp), faster from a batch size the
  /// crossover table gives per path (NOTE [decode crossovers]) and as large
  /// again as the weights. "auto" packs when the steps will batch that far:
  /// the expected sequences (else max_num_seqs) reach the crossover, and
  /// reads the copy from it on; "on" reads it at every batched step; "off"
  /// never makes it. The planner's memory estimate uses the same rule.
  panels_mode decode_panels = panels_mode::automatic;
  /// The CPU decode's instruction-set path: auto (the widest this CPU
  /// runs), avx512, avx2, baseline; a path the CPU lacks is refused.
  isa_mode decode_isa = isa_mode::automatic;
  /// Every step through the batch-invariant kernels (NOTE [batch-invariant
  /// forward] in models/batch_invariant.hpp): a request's logits and
  /// log-probs have the same bits whatever else is batched with it.
  bool batch_invariant = false;
  /// What a weight update does to running sequences (NOTE [in-flight update]).
  update_kv on_update = update_kv::keep;
};

/// Whether an engine with this config packs its weights when its model is
/// fp32 on the CPU (NOTE [decode panels]).
bool packs_decode_panels(const engine_config& c);

/// Bytes of one KV block of `model` (K and V, every layer) with elements
/// of `element_size` bytes.
int64_t kv_block_bytes(const engine_config& c, const models::llama_config& model,
                       int64_t element_size);

/// The shape whose kv heads a TP rank's KV pool holds: its own when they
/// are split, all of them when replicated (NOTE [tensor-parallel decode]
/// in models/llama.cpp).
models::llama_config kv_pool_shape(const models::llama_config& model,
                                   const models::tp_partition& tp);

/// NOTE [kv pool size]: the blocks of the KV pool. num_blocks when given;
/// else what the work can hold at once — the expected sequences (at most
/// max_num_seqs) of the expected longest length, at least one sequence of
/// the whole context, so that any request the engine accepts fits — and
/// never more than kv_cache_mb. The planner's memory estimate uses the same
/// rule. Errors when the cap holds no block.
expected<int64_t> kv_pool_blocks(const engine_config& c, const models::llama_config& model,
                                 int64_t element_size);

/// Checks ranges; messages name the field ("engine.block_size: ...").
expected<void> validate(const engine_config& c);

/// The job-file keys of an engine (NOTE [config visitors] in
/// runtime/config.hpp); `seed` is not one: jobs derive it from run.seed.
template <class V>
void visit(V& v, engine_config& c) {
  v.field("block_size", c.block_size, "Tokens per KV block");
  v.field("num_blocks", c.num_blocks, "KV blocks; 0 = sized to the work, within kv_cache_mb");
  v.field("kv_cache_mb", c.kv_cache_mb, "The KV pool's cap when num_blocks is 0 (MiB)");
  v.field("max_num_seqs", c.max_num_seqs, "Running sequences at most");
  v.field("max_batched_tokens", c.max_batched_tokens, "Tokens per engine step at most");
  v.field("max_model_len", c.max_model_len, "Prompt + generation limit; 0 = the model's context");
  v.field("enable_prefix_caching", c.enable_prefix_caching, "Share prompt KV between samples");
  v.choice("decode_panels", c.decode_panels,
           "CPU decode of batches from a packed copy of the weights (auto: where it wins)");
  v.choice("decode_isa", c.decode_isa,
           "CPU decode instruction set (auto: the widest this CPU runs)");
  v.field("batch_invariant", c.batch_invariant,
          "Batch-invariant CPU kernels: a request's tokens and log-probs do not depend on what "
          "else is batched (fp32 CPU model; slower)");
  v.choice("on_update", c.on_update,
           "A weight update while sequences run: keep their K/V (continue under the new weights) "
           "or recompute it");
}

struct generate_request {
  /// Caller's id, echoed in the output (must be unique among live requests).
  std::string id;
  std::vector<int64_t> prompt;
  sampling_params sampling;
  /// NOTE [token-in, token-out]: the finished sample of this engine that
  /// this request continues ("" = none), as sample_ref names it (a
  /// request's id alone names its sample 0): its sequence (prompt and that
  /// sample's tokens) comes first, then `prompt` — the appended tokens (a
  /// tool's output, the next user turn) — so a conversation is extended by
  /// token ids, never rendered and tokenised again. The K/V of the earlier
  /// sequence's whole blocks is reused from the prefix cache. The output's
  /// prompt is the whole sequence.
  std::string extends;
};

/// The name of sample `index` of request `id` for generate_request::extends:
/// the id for sample 0, else "<id>#<index>".
std::string sample_ref(const std::string& id, size_t index);
/// The request id and sample index a sample_ref names ("a#2" → {"a", 2};
/// an id without a "#<digits>" tail → {id, 0}).
std::pair<std::string, size_t> parse_sample_ref(const std::string& ref);

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generate_request& x) {
  return f(caf::meta::type_name("generate_request"), x.id, x.prompt, x.sampling, x.extends);
}

struct sample_output {
  std::vector<int64_t> tokens;
  /// Log-prob of each token under the temperature-scaled distribution, by
  /// the weights that sampled it (the behaviour policy's).
  std::vector<float> logprobs;
  /// The weight version that sampled each token (NOTE [in-flight update]).
  std::vector<int64_t> versions;
  /// "stop" (a stop token or EOS) or "length" (max_tokens or context).
  std::string finish_reason;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sample_output& x) {
  return f(caf::meta::type_name("sample_output"), x.tokens, runtime::wire(x.logprobs), x.versions,
           x.finish_reason);
}

struct request_output {
  std::string id;
  std::vector<int64_t> prompt;
  /// n samples, in sample-index order.
  std::vector<sample_output> samples;
  /// Weight version that produced the last tokens.
  int64_t weight_version = 0;
  /// Weight version of the first generated token; equals weight_version
  /// unless new weights were loaded while this request was in flight.
  int64_t first_weight_version = 0;
  /// Arrival to first token, and to completion (milliseconds).
  double ttft_ms = 0;
  double latency_ms = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, request_output& x) {
  return f(caf::meta::type_name("request_output"), x.id, x.prompt, x.samples, x.weight_version,
           x.first_weight_version, runtime::wire(x.ttft_ms), runtime::wire(x.latency_ms));
}

/// Cumulative counters and current gauges.
struct engine_metrics {
  int64_t steps = 0;
  int64_t prompt_tokens = 0;          ///< prompt tokens of admitted requests
  int64_t prefill_tokens_computed = 0; ///< prompt tokens actually run (after prefix hits)
  int64_t generated_tokens = 0;
  /// Tokens of running sequences whose K/V was computed again (after a
  /// preemption, or a recomputing weight update: NOTE [in-flight update]).
  int64_t recomputed_tokens = 0;
  int64_t preemptions = 0;
  int64_t finished_requests = 0;
  double busy_seconds = 0;             ///< time inside step()
  double ttft_ms_sum = 0;
  double itl_ms_sum = 0;               ///< inter-token latency, summed over decode tokens
  int64_t itl_count = 0;
  double prefix_hit_rate = 0;          ///< hit tokens / queried tokens of the prefix cache
  double kv_utilization = 0;           ///< used blocks / all blocks, now
  double kv_peak_utilization = 0;      ///< the highest after a step since reset_kv_peak
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t num_blocks = 0;
  /// Steps with decode rows (mixed ones too) by their path (NOTE [decode
  /// path report] in models/llama.hpp), and why the latest ATen one was.
  int64_t fused_decode_steps = 0;
  int64_t aten_decode_steps = 0;
  std::string aten_decode_reason;
  /// Generated tokens per busy second.
  double tokens_per_second() const;
  double mean_ttft_ms() const;
  double mean_itl_ms() const;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_metrics& x) {
  return f(caf::meta::type_name("engine_metrics"), x.steps, x.prompt_tokens,
           x.prefill_tokens_computed, x.generated_tokens, x.recomputed_tokens, x.preemptions,
           x.finished_requests, runtime::wire(x.busy_seconds), runtime::wire(x.ttft_ms_sum),
           runtime::wire(x.itl_ms_sum), x.itl_count, runtime::wire(x.prefix_hit_rate),
           runtime::wire(x.kv_utilization), runtime::wire(x.kv_peak_utilization), x.running,
           x.waiting, x.num_blocks, x.fused_decode_steps, x.aten_decode_steps,
           x.aten_decode_reason);
}

class engine {
public:
  /// Takes a model with an lm head (shared: weight updates write into it).
  static expected<std::unique_ptr<engine>> make(models::llama_model model,
                                                const engine_config& config);
  ~engine();
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  /// Queues a request after validating it (empty prompt, prompt longer than
  /// the context, token ids outside the vocabulary, bad sampling fields and
  /// duplicate ids are errors naming the request and field); other requests
  /// are never disturbed by a rejected one.
  expected<void> add_request(generate_request request);

  /// Queues every request, or none: all are validated first (as
  /// add_request does, plus ids unique within the batch).
  expected<void> add_requests(std::vector<generate_request> requests);

  /// Runs one scheduler step; returns the requests that finished in it.
  expected<std::vector<request_output>> step();

  /// Steps until every queued request has finished.
  expected<std::vector<request_output>> run_until_idle();

  /// Generates `requests` to completion (outputs in the same order); a bad
  /// request fails the call before any is queued.
  expected<std::vector<request_output>> generate(std::vector<generate_request> requests);

  bool idle() const;

  /// Loads new weights (HF names, as export_hf_weights writes them) in place
  /// between steps: the KV pool is kept, the prefix cache is cleared, and
  /// running sequences keep their K/V or recompute it (config().on_update,
  /// NOTE [in-flight update]). Later tokens carry `version`, which must be
  /// greater than the current one.
  expected<void> load_weights(int64_t version, const std::map<std::string, at::Tensor>& hf_tensors);

  int64_t weight_version() const;
  engine_metrics metrics() const;
  const engine_config& config() const;

  /// Free KV blocks now (for leak checks: all of them when idle, prefix cache cleared).
  int64_t free_blocks() const;
  /// Drops the prefix cache's blocks.
  void clear_prefix_cache();
  /// Starts a new window for engine_metrics::kv_peak_utilization.
  void reset_kv_peak();
  /// Frees the KV pool and the packed decode weights while idle (co-located
  /// offload: the memory goes to the roles that train meanwhile); the next
  /// step allocates them again.
  /// Answers the bytes freed (0 when already released); an error while
  /// requests run.
  expected<int64_t> release_kv_cache();
  bool kv_cache_released() const;

  /// NOTE [engine snapshot]: the requests in the engine, as bytes — each
  /// with its samples' tokens, log-probs, versions, random streams and
  /// finish state, the order of the running and waiting queues, the K/V of
  /// the blocks they hold, and the engine's counters. import_state rebuilds
  /// them in an engine that holds no requests, at the same weight version
  /// and KV block shape; from there it steps exactly as this engine would
  /// have (the prefix cache is not part of it: a prefix it would have served
  /// is computed again, to the same values). Answers the restored ids.
  expected<std::string> export_state() const;
  expected<std::vector<std::string>> import_state(const std::string& bytes);
  /// Whether a request of this id is queued or running.
  bool holds(const std::string& id) const;

private:
  engine();
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace troupe::actors::inference
