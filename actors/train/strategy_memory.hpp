#pragma once
// What one training rank holds at its peak, term by term — the planner's
// arithmetic beside NOTE [strategy memory] (in actors/train/dp_strategy.hpp:
// the bytes a parameter), apart so that the job file's many includers do not
// rebuild when it changes. fp32 throughout.

#include "actors/train/dp_strategy.hpp"
#include "models/config.hpp"

#include <cstdint>
#include <string_view>
#include <vector>

namespace troupe::actors::train {

/// A model's parameters: one transformer layer's, and the rest (embeddings,
/// final norm, head).
struct parameter_split {
  int64_t layer = 0, layers = 0, rest = 0;
  int64_t largest = 0; // elements of the largest parameter
  int64_t total() const { return layers * layer + rest; }
};

/// The split of a Llama-family model with an LM head (`lm_head`) or a
/// scalar head (value / reward).
parameter_split split_parameters(const models::llama_config& c, bool lm_head);

/// NOTE [activation memory]: what the autograd graph of one micro-batch
/// (`rows` sequences of `tokens`) keeps from forward to backward, counted
/// from the tensors models/llama.cpp's training forward saves (LibTorch's
/// CPU build; checked against the counting allocator, within 3 % on the
/// test shapes). N = rows · tokens; fp32 elements:
///   - a layer: 7·H + 3·q + 2·kv + 4·I + 2 a token (its input, two RMSNorm
///     results and outputs, the residual; q's projection, its rotated half,
///     the grouped copy and the attention output; K and V; the MLP's gate,
///     its SiLU, the up projection and their product; two RMSNorm scales),
///     heads · tokens a token for the softmax probabilities, and a byte a
///     key for the attention mask;
///   - the rest: 4·H + 2·head_dim a token (embedding output, the final
///     norm's, the RoPE tables), the logits (V a token with an LM head,
///     and their contiguous shifted copy when rows > 1), 5 a token of
///     scalars (log-probs, masks, the loss's terms).
struct activation_split {
  double layer = 0;       // one layer's
  double layer_input = 0; // what a checkpointed layer keeps (its input)
  double rest = 0;        // embeddings, final norm, head, loss
  double logits = 0;      // of `rest`: the logits and their shifted copy
  int64_t layers = 0;
  double total() const { return static_cast<double>(layers) * layer + rest; }
};

activation_split activation_bytes(const models::llama_config& c, bool lm_head, int64_t rows,
                                  int64_t tokens);

/// One named part of a rank's peak.
struct memory_term {
  std::string_view name;
  double bytes = 0;
};

/// NOTE [rank memory]: a training rank's bytes at its peak, by term. The
/// states are NOTE [strategy memory]'s (weights, gradients, AdamW's
/// moments); `activations` one micro-batch's graph; `transient` what the
/// strategy holds besides them at the top of backward: the largest
/// parameter's gradient as autograd hands it over (ddp, zero1, zero2), and
/// zero2's first gradient bucket (bucket_mb, at most the model) less the
/// logits it replaces (it is made as they are freed); zero3
/// keeps only each layer's input through forward and peaks while a layer's
/// backward runs: the rest-unit whole with its gradients (8 · rest), the
/// layer whole, its gradients and their padded copy for the reduce-scatter
/// (12 · layer) and the layer's recomputed activations (an upper bound:
/// measured 0.73-0.76 of it, the layer's activations going as its
/// gradients come).
/// The optimizer step's temporaries (AdamW's denominator: 4 bytes an
/// element of what the rank steps; the gradient norm's double chunk of at
/// most 1M elements) replace the activations, so the peak is the larger of
/// the two moments.
struct rank_memory {
  double weights = 0, gradients = 0, optimizer = 0, activations = 0, transient = 0;
  double step_temporaries = 0;
  /// The peak: the states plus the larger of (activations + transient) and
  /// the step's temporaries.
  double total() const;
  /// The terms of the peak, largest first.
  std::vector<memory_term> terms() const;
};

rank_memory training_rank_memory(dp_strategy s, int64_t dp, double bucket_mb,
                                 const parameter_split& params,
                                 const activation_split& activations);

} // namespace troupe::actors::train
