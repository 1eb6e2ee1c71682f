#pragma once
// The training engine: one model (lm, value or reward head) with an optional
// AdamW optimizer, and the forward passes and updates every trainable role
// needs — policy (PPO / GRPO actor loss, SFT), critic (clipped value loss),
// reward model (Bradley–Terry), reference (forward only). A plain class;
// actors/train/engine_actor.hpp runs it in a detached actor. Not thread-safe.
//
// NOTE [sequence batches]: a batch of sequences is a runtime::tensor_batch
// with "input_ids" [B, L] int64 (right-padded) and "attention_mask" [B, L];
// per-token quantities live in the SHIFTED space [B, L-1]: column t refers to
// token t+1, predicted from positions 0..t (logits[:, t] score input_ids[:,
// t+1]; values[:, t] is the critic's value of the state before token t+1).
// "response_mask" [B, L-1] marks the response tokens in that space. RL
// batches add "old_log_probs", "ref_log_probs", "advantages", "returns",
// "values" [B, L-1]; preference batches hold "chosen_ids", "chosen_mask",
// "rejected_ids", "rejected_mask" [B, L].

#include "actors/train/optimizer_options.hpp"
#include "actors/train/training_strategy.hpp"
#include "kernels/kl.hpp"
#include "kernels/losses.hpp"
#include "kernels/masked.hpp"
#include "kernels/preference.hpp"
#include "runtime/collectives.hpp"
#include "runtime/error.hpp"
#include "runtime/pipeline_schedule.hpp"
#include "runtime/tensor_batch.hpp"
#include "runtime/weight_transport.hpp"
#include "runtime/wire_float.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace troupe::models {
class llama_model;
} // namespace troupe::models

namespace troupe::actors::train {

using runtime::metric_map;

/// Options of a policy update.
struct policy_update_options {
  int64_t epochs = 1;
  int64_t minibatches = 1;
  /// What the update minimises (NOTE [policy loss spec] in kernels/losses.hpp):
  /// the policy loss, its clips and aggregation, the entropy and KL terms
  /// (a KL loss needs "ref_log_probs"). seq-mean-token-sum-norm's factor 0
  /// means the batch's response_mask columns, fixed for the whole update.
  kernels::policy_loss_spec loss;
  /// Softmax temperature of the log-probs (the rollout's sampling temperature).
  double temperature = 1.0;
  /// Seed of the minibatch shuffle (same seed → same minibatches).
  uint64_t shuffle_seed = 0;
  /// false: the batch is already arranged (a DP rank's share of every
  /// minibatch, in order): consecutive slices, no shuffle.
  bool shuffle = true;
  /// The optimizer's learning rate from this update on (a runtime setting);
  /// 0 = keep the engine's.
  double lr = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, policy_update_options& x) {
  auto& l = x.loss;
  bool dual_clip = l.options.dual_clip_c.has_value();
  double dual_clip_c = l.options.dual_clip_c.value_or(0.0);
  auto load = caf::meta::load_callback([&]() -> caf::error {
    l.options.dual_clip_c = dual_clip ? std::optional<double>{dual_clip_c} : std::nullopt;
    return caf::error{};
  });
  return f(caf::meta::type_name("policy_update_options"), x.epochs, x.minibatches, l.kind,
           runtime::wire(l.options.clip_low), runtime::wire(l.options.clip_high), dual_clip,
           runtime::wire(dual_clip_c), l.options.agg, runtime::wire(l.options.loss_scale_factor),
           runtime::wire(l.entropy_coef), runtime::wire(l.kl_coef), l.kl,
           runtime::wire(x.temperature), x.shuffle_seed, x.shuffle, runtime::wire(x.lr), load);
}

/// Options of a critic update.
struct critic_update_options {
  int64_t epochs = 1;
  int64_t minibatches = 1;
  /// Clip values to old ± this; 0 = off.
  double value_clip = 0.2;
  kernels::loss_agg_mode loss_agg = kernels::loss_agg_mode::token_mean;
  /// seq-mean-token-sum-norm's divisor; 0 = the batch's response_mask columns.
  double loss_scale_factor = 0;
  uint64_t shuffle_seed = 0;
  /// As policy_update_options::shuffle.
  bool shuffle = true;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, critic_update_options& x) {
  return f(caf::meta::type_name("critic_update_options"), x.epochs, x.minibatches,
           runtime::wire(x.value_clip), x.loss_agg, runtime::wire(x.loss_scale_factor),
           x.shuffle_seed, x.shuffle);
}

/// Options of a DPO step (its loss: kernels/preference.hpp).
struct dpo_step_options {
  kernels::dpo_options loss;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, dpo_step_options& x) {
  return f(caf::meta::type_name("dpo_step_options"), runtime::wire(x.loss.beta), x.loss.loss,
           runtime::wire(x.loss.label_smoothing));
}

/// The minibatches of `epochs` passes over `batch`, `parts` per pass: each
/// pass a seeded shuffle (seed + pass) split into consecutive slices; with
/// shuffle false, the batch's own order. The engine and the DP group's
/// dispatcher both use this, so DP ranks see exactly the single-rank
/// minibatches.
expected<std::vector<runtime::tensor_batch>> make_minibatches(const runtime::tensor_batch& batch,
                                                              int64_t epochs, int64_t parts,
                                                              uint64_t seed, bool shuffle = true);

/// A rank's groups: the rendezvous store and the c10d group of its
/// data-parallel line; under tensor parallelism (NOTE [tensor parallelism]
/// in models/tensor_parallel.hpp) also its TP line, which the model's
/// partition points at, under pipeline parallelism (NOTE [pipeline
/// parallelism] in models/pipeline_parallel.hpp) its PP line, which the
/// model's stage points at, and the mesh group they were split from — the
/// engine that joins keeps them as long as it lives.
struct data_parallel_group {
  runtime::store store;
  runtime::process_group group;
  std::shared_ptr<runtime::process_group> tp, mesh, pp;
};

class train_engine {
public:
  /// Takes the model; with `optim` the engine is trainable.
  static expected<std::unique_ptr<train_engine>> make(models::llama_model model,
                                                      std::optional<optimizer_options> optim);
  ~train_engine();
  train_engine(const train_engine&) = delete;
  train_engine& operator=(const train_engine&) = delete;

  bool trainable() const;
  /// Optimizer steps taken.
  int64_t steps() const;

  /// lm head: "log_probs" [B, L-1] of the next tokens under softmax(logits /
  /// temperature), and "entropy" [B, L-1] when asked. No gradient.
  expected<runtime::tensor_batch> log_probs(const runtime::tensor_batch& batch, double temperature,
                                            bool with_entropy);

  /// value head: "values" [B, L-1] (shifted). No gradient.
  expected<runtime::tensor_batch> values(const runtime::tensor_batch& batch);

  /// reward head: "scores" [B] at each row's last real token. No gradient.
  expected<runtime::tensor_batch> scores(const runtime::tensor_batch& batch);

  /// The loss of opts.loss (PPO, GSPO or CISPO, + entropy bonus, + KL loss)
  /// over epochs × minibatches of an RL batch; metrics actor/* averaged over
  /// the optimizer steps.
  /// NOTE [first-minibatch contract]: the first minibatch's forward comes
  /// before any step, so its log-probs are what the policy's weights give
  /// the batch's samples; against the batch's old_log_probs it reports
  /// actor/first_minibatch/logprob_abs_diff_mean and …_max (masked |new −
  /// old|) and …/ppo_kl (masked mean of old − new). A metric named *_max
  /// is combined by max (over micro-batches, steps and DP ranks).
  expected<metric_map> update_policy(const runtime::tensor_batch& batch,
                                     const policy_update_options& opts);

  /// Clipped value loss over epochs × minibatches; metrics critic/*.
  expected<metric_map> update_critic(const runtime::tensor_batch& batch,
                                     const critic_update_options& opts);

  /// One SFT step: mean negative log-likelihood of the response tokens;
  /// metrics sft/loss, sft/grad_norm, sft/lr.
  expected<metric_map> sft_step(const runtime::tensor_batch& batch);

  /// One reward-model step on preference pairs: −log σ(r_chosen − r_rejected);
  /// metrics rm/loss, rm/accuracy, rm/margin, rm/grad_norm, rm/lr.
  expected<metric_map> rm_step(const runtime::tensor_batch& batch);

  /// Pairwise accuracy and mean loss of preference pairs without training
  /// (rm/eval_accuracy, rm/eval_loss).
  expected<metric_map> rm_eval(const runtime::tensor_batch& batch);

  /// One DPO step (lm head) on preference pairs (NOTE [preference batches]
  /// in actors/rl/data.hpp) that carry the reference's sequence log-probs
  /// "ref_chosen_logps", "ref_rejected_logps" [B]: the loss of opts.loss over
  /// the pairs (a pair is a loss unit); metrics under TRL's names —
  /// rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins,
  /// logps/chosen, logps/rejected — and dpo/loss, dpo/grad_norm, dpo/lr.
  expected<metric_map> dpo_step(const runtime::tensor_batch& batch, const dpo_step_options& opts);

  /// The weights under HF names (what the rollout engine loads): contiguous
  /// CPU copies in the parameters' dtype. Under zero3 every rank takes part
  /// (the others call gather_weights), a unit gathered at a time (NOTE
  /// [export units] in training_strategy.hpp).
  std::map<std::string, at::Tensor> export_weights() const;
  /// What the last export held beyond its copy: the largest unit gathered
  /// (zero3) and the largest tensor it made (a TP gather, a later pipeline
  /// stage's part); 0 when it made none (NOTE [sync staging]).
  int64_t export_spike_bytes() const;
  /// The exported tensors — HF name, dtype, shape — in the order
  /// export_weights_to hands them over (NOTE [export units]).
  std::vector<runtime::tensor_spec> export_layout() const;
  /// The export as a stream (NOTE [streamed publish]): put(i, t) for each
  /// tensor i of export_layout(), in order, a view of the parameter valid
  /// during the call only (no copy: a transport copies it into its buffer).
  expected<void> export_weights_to(const runtime::tensor_sink& put) const;

  /// Writes the model as a HF directory (config.json + model.safetensors).
  expected<void> save_pretrained(const std::string& dir) const;
  /// Makes the weights whole and frees them again, as export_weights does,
  /// exporting nothing: a zero3 rank's part in another rank's export (every
  /// rank gathers); answers the bytes made whole (0 when nothing is
  /// sharded).
  expected<int64_t> gather_weights() const;

  /// Training state (parameters, optimizer moments, step count) as bytes,
  /// and back. Restoring into an engine of another shape is an error.
  expected<std::string> save_state() const;
  expected<void> load_state(const std::string& bytes);
  /// NOTE [sharded state]: this rank's shard of the training state as
  /// bytes — no rank gathers — and a state from every rank's shard of it,
  /// written under any DP size and strategy: the whole is assembled (each
  /// element exactly once, or corrupted naming the gap) and loaded as
  /// load_state does.
  expected<std::string> save_shard() const;
  expected<void> load_shards(const std::vector<std::string>& shards);

  /// NOTE [peer state]: with `on`, every update (update_policy,
  /// update_critic) first keeps the training state as it was, so that this
  /// rank, surviving a DP peer lost during the update, can hand the
  /// peer's replacement the state the update began from. ddp only (a rank
  /// holds the whole state); errc::unsupported under a sharding strategy
  /// or a model part. Call after join_data_parallel.
  expected<void> keep_state_before_updates(bool on);
  /// The state (save_state's bytes) before the last update when one was
  /// kept, else the state now.
  expected<std::string> state_before_update() const;
  /// NOTE [kill inside a collective]: the `nth` operation (from 1) this
  /// rank's DP group makes from now on calls `die` first (which ends the
  /// process, or throws: the operation's caller then fails).
  expected<void> die_in_collective(int64_t nth, std::function<void()> die);

  /// Joins a data-parallel group (NOTE [data-parallel training]) under a
  /// strategy (NOTE [training strategies]), before the first optimizer step:
  /// the parameters are broadcast from rank 0, and every optimizer step from
  /// now on weights the local loss by its share of the group's loss units
  /// and lets the strategy sum the gradients over the group (ddp: all-reduced
  /// in buckets of bucket_mb; zero1: reduce-scattered into each rank's shard)
  /// before clipping and stepping. A frozen engine joins under ddp only.
  expected<void> join_data_parallel(std::shared_ptr<data_parallel_group> group,
                                    const strategy_options& options = {});
  /// DP size (1 without a group).
  int data_parallel_size() const;
  /// The strategy's kind (ddp without a group).
  dp_strategy strategy() const;
  /// Computes every update and forward pass `rows` rows at a time (NOTE
  /// [micro-batches]: the gradients accumulate, and the result does not
  /// depend on the size); 0 = a batch at once.
  expected<void> set_micro_batch_rows(int64_t rows);
  /// Or at most `tokens` padded tokens at a time, rows grouped by length
  /// (NOTE [token micro-batches] in micro_batches.hpp); 0 = off. It takes
  /// precedence over the rows.
  expected<void> set_micro_batch_tokens(int64_t tokens);
  /// NOTE [true on-policy] in actors/rl/rl_stage.cpp: log_probs and the
  /// update's log-probs take their values from the batch-invariant forward
  /// (models/batch_invariant.hpp), bit for bit what a batch-invariant
  /// inference engine samples with; the gradient still flows through the
  /// ATen forward (the loss sees lp_aten − sg(lp_aten) + lp_invariant, whose
  /// value is lp_invariant exactly). Refused for a model that path cannot
  /// run (not fp32 on the CPU, a TP or PP part).
  expected<void> set_batch_invariant(bool on);
  /// NOTE [pipeline execution]: a pipeline stage's engine cuts a batch it
  /// computes into `n` micro-batches when neither micro-batch setting above
  /// is on (0 = as many as stages), and runs them through the stages under
  /// the 1F1B schedule (forward only for log-probs, values and scores).
  expected<void> set_pipeline_micro_batches(int64_t n);
  /// This stage's last pipelined pass: its actions in the order it ran
  /// them, the pass's wall time, and the part of it spent computing (not
  /// waiting for a neighbour's activations or gradients).
  struct pipeline_pass {
    std::vector<runtime::pipe_action> actions;
    double seconds = 0, busy_seconds = 0;
  };
  pipeline_pass last_pipeline_pass() const;

  /// Computes in `p` (NOTE [mixed precision] in strategy_parts.hpp): bf16
  /// rounds the weights to bf16 once, and a trainable engine steps them
  /// through fp32 masters. Before join_data_parallel and the first step;
  /// bf16 back to fp32 is refused (the rounding cannot be undone).
  expected<void> set_precision(precision p);
  precision compute_precision() const;
  /// Bytes of optimizer state this rank holds now (0 while offloaded, and
  /// before the first step).
  int64_t optimizer_state_bytes() const;

  /// Co-located offload: writes the optimizer state to `path` and frees it
  /// and the gradients; the next update (or save_state) reads it back and
  /// removes the file, so training continues exactly. Answers the bytes
  /// freed (0 for a frozen engine or one already offloaded).
  expected<int64_t> offload_optimizer(const std::string& path);
  bool optimizer_offloaded() const;
  /// Co-located offload of a frozen engine (reference, reward model): writes
  /// its weights to `path` once (temp + rename; they never change) and frees
  /// them; the next call that reads the model loads them back. Answers the
  /// bytes freed (0 for a trainable engine, or when already offloaded). The
  /// file is removed with the engine.
  expected<int64_t> offload_weights(const std::string& path);
  bool weights_offloaded() const;

  /// The model (for callers that need its config).
  const models::llama_model& model() const;

private:
  train_engine();
  expected<void> keep_state_before_update();
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace troupe::actors::train
