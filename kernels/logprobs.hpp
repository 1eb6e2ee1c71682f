#pragma once
// Functions of full logits over the vocabulary: token log-probs, entropy and
// the exact KL between two distributions. The default versions stream over
// vocabulary chunks (online logsumexp), so beyond their outputs they allocate
// O(rows · chunk) temporaries instead of an fp32 copy of the [B, T, V] logits.
//
// Convention: logits [B, T, V] score the token at the SAME position:
// token_log_probs(logits, tokens)[b, t] = log_softmax(logits[b, t] / τ)[tokens[b, t]].
// For a causal LM (position t predicts token t + 1) the caller shifts:
// logits[:, :-1] with tokens[:, 1:].
//
// Any leading shape works ([..., V] with tokens [...]); results have the
// shape of logits without the last dimension. Logits may be fp16, bf16, fp32
// or fp64; the math runs in fp32 (fp64 for fp64 logits) and results have that
// dtype. The chunked versions are differentiable in the logits (a custom
// backward that recomputes the softmax chunk by chunk). CPU tensors run the
// ATen reference; CUDA tensors run the fused kernel when the build has one
// (kernels/cuda/logprobs.cu) and fail with errc::unsupported otherwise.

#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace troupe::runtime {
class process_group;
} // namespace troupe::runtime

namespace troupe::kernels {

/// Options of the chunked logits functions.
struct logits_options {
  /// Vocabulary entries per chunk (>= 1; clipped to V).
  int64_t chunk_size = 4096;
  /// Softmax temperature τ (> 0): probabilities are softmax(logits / τ).
  double temperature = 1.0;
};

/// Log-probs and entropies of the same rows.
struct log_probs_entropy {
  /// [...]: log p(tokens).
  at::Tensor log_probs;
  /// [...]: −Σ_v p_v log p_v, in nats.
  at::Tensor entropy;
};

/// logits [..., V], tokens [...] (integer ids in [0, V)) → log p(token) [...], chunked over V.
expected<at::Tensor> token_log_probs(const at::Tensor& logits, const at::Tensor& tokens,
                                     const logits_options& opts = {});

/// logits [..., V] → entropy [...] in nats, chunked over V (one online pass).
expected<at::Tensor> entropy_from_logits(const at::Tensor& logits, const logits_options& opts = {});

/// Both of the above in one pass over the logits (the fused CUDA kernel on GPU).
expected<log_probs_entropy> token_log_probs_and_entropy(const at::Tensor& logits,
                                                        const at::Tensor& tokens,
                                                        const logits_options& opts = {});

/// NOTE [vocab-parallel log-probs]: under tensor parallelism each rank of
/// the group holds the logits of a contiguous part of the vocabulary (the
/// vocab-parallel LM head), and no rank materialises the whole [..., V]:
/// the largest logit, the sums of exp(x − max) and exp(x − max)·(x − max), and the
/// target's logit (held by one rank) are reduced across the group, so each
/// rank ends with every row's log p(token) and entropy, equal on all ranks.
/// The backward needs no collective (each rank differentiates its columns).
/// `logits` [..., V_r] holds ids [vocab_start, vocab_start + V_r) of a
/// vocabulary of `vocab`; tokens [...] are ids in [0, vocab). Every rank of
/// `group` calls it with its shard, in the same order as its other
/// collectives. Allocates [rows, V_r] in fp32 (fp64 for fp64 logits).
expected<log_probs_entropy> vocab_parallel_log_probs_and_entropy(const at::Tensor& logits,
                                                                 const at::Tensor& tokens,
                                                                 int64_t vocab_start, int64_t vocab,
                                                                 runtime::process_group& group,
                                                                 const logits_options& opts = {});

/// Baseline: log_softmax over the full vocabulary, then gather. Allocates [..., V] fp32.
expected<at::Tensor> token_log_probs_full(const at::Tensor& logits, const at::Tensor& tokens,
                                          double temperature = 1.0);

/// Baseline: entropy through a full softmax (finite logits only). Allocates [..., V] fp32.
expected<at::Tensor> entropy_full(const at::Tensor& logits, double temperature = 1.0);

/// KL(p ‖ q) = Σ_v p_v (log p_v − log q_v) [...] with p = softmax(logits / τ) and
/// q = softmax(ref_logits / τ), both [..., V]; chunked over V, ≥ 0, differentiable in both.
expected<at::Tensor> exact_kl_from_logits(const at::Tensor& logits, const at::Tensor& ref_logits,
                                          const logits_options& opts = {});

} // namespace troupe::kernels
