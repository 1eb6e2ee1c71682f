#pragma once
// The decoder's forward through the batch-invariant kernels (NOTE
// [batch-invariant kernels] in kernels/cpu/invariant.hpp), for the
// trainer–generator contract's exact mode (rl.true_on_policy).
//
// NOTE [batch-invariant forward]: every token is computed on its own — its
// embedding row, RMSNorm, q/k/v/o and MLP rows, RoPE, and its attention over
// the K/V of its sequence's earlier tokens in position order — by kernels
// whose float operations depend on nothing else in the batch. The inference
// engine runs its paged steps this way (prefill chunks, decode steps,
// prefix-cache hits: a cached K/V row was computed by the same code), and
// the trainer's log-probs build the same paged layout from a padded batch
// (each row's real tokens at positions 0, 1, …: NOTE [padding and
// positions]) and run the same step, so a token's logits have the same bits
// on both sides. Its log-prob is kernels/cpu/softmax_row.hpp's row at scale
// 1/temperature — the sampler's function — so the engine's sampled
// log-probs, the policy's old log-probs and the update's log-probs are equal
// bit for bit. fp32 weights on the CPU, one process holding the whole model
// (no TP, no PP stage, no ZeRO-3 shards), an lm head.

#include "models/llama.hpp"
#include "runtime/error.hpp"

#include <string>

namespace troupe::models {

/// Why `model` cannot run the batch-invariant path ("" when it can).
std::string batch_invariant_unsupported(const llama_model_impl& model);

/// One paged step as forward_paged does it (same arguments and logits [M,
/// V]), through the batch-invariant kernels. Throws c10::Error on bad input.
torch::Tensor batch_invariant_step(const llama_model_impl& model, const paged_batch& batch,
                                   paged_kv_cache& cache, const torch::Tensor& logit_rows);

/// log p(input_ids[b][t + 1] | input_ids[b][..t]) under softmax(logits /
/// temperature) (temperature 0: the logits as they are, as the sampler's
/// greedy rows), [B, T-1] fp32, through the batch-invariant path; entries
/// where `want` [B, T-1] is 0, or either token is padding, are 0. No
/// autograd.
expected<torch::Tensor> batch_invariant_log_probs(const llama_model_impl& model,
                                                  const torch::Tensor& input_ids,
                                                  const torch::Tensor& attention_mask,
                                                  double temperature, const torch::Tensor& want);

} // namespace troupe::models
