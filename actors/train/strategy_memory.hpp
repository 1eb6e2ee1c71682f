#pragma once
// What one training rank holds at its peak, term by term — the planner's
// arithmetic, apart from dp_strategy.hpp so that the job file's many
// includers do not rebuild when it changes. fp32, or bf16 (NOTE [mixed
// precision] in strategy_parts.hpp).

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
/// scalar head (value / reward); under tensor parallelism of size `tp`
/// (NOTE [tensor parallelism] in models/tensor_parallel.hpp) the part of
/// the rank holding the most (vocabulary parts differ by a row).
parameter_split split_parameters(const models::llama_config& c, bool lm_head, int64_t tp = 1);

/// Bytes of a weight or gradient element at precision `p`.
constexpr double bytes_per_element(precision p) {
  return p == precision::bf16 ? 2 : 4;
}

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
///     scalars (log-probs, masks, the loss's terms);
///   - a layer's backward, beyond its activations: the probabilities'
///     gradient (heads · tokens a token), the hidden state's (H a token)
///     and one H x I weight gradient — what a recomputed layer adds at its
///     peak (zero3; measured within 1 %).
/// In bf16 the elements above take 2 bytes, and fp32 copies come on top
/// (fitted exactly on 10 shapes the same way): each RMSNorm keeps its input
/// widened (4·H a token, two a layer, one at the end) and its scale (4), the
/// softmax its fp32 probabilities beside their bf16 copy (6 bytes an
/// element), the loss 16 bytes a token (8 more a shifted token); a
/// recomputed layer's backward is counted as 4 bytes a probability (its
/// gradient widened for the fp32 softmax), 2 an element of the hidden
/// state and of one weight gradient (zero3 bf16: within 1.2 %).
struct activation_split {
  double layer = 0;          // one layer's
  double layer_input = 0;    // what a checkpointed layer keeps (its input)
  double rest = 0;           // embeddings, final norm, head, loss
  double logits = 0;         // of `rest`: the logits and their shifted copy
  double layer_backward = 0; // a layer's backward working set (see below)
  int64_t layers = 0;
  double total() const { return static_cast<double>(layers) * layer + rest; }
};

/// Under tensor parallelism a rank's activations are counted whole: the
/// split widths alone undercount a TP rank's peak (measured 1.17-1.29x of
/// them: the vocabulary-parallel log-prob backward's [N, V/tp] working set
/// and the hidden-size tensors each rank keeps), so the whole count stays
/// the bound (StrategyMemory.TensorParallelRanksPeakWithinThePlan).
activation_split activation_bytes(const models::llama_config& c, bool lm_head, int64_t rows,
                                  int64_t tokens, precision p = precision::fp32);

/// One named part of a rank's peak.
struct memory_term {
  std::string name;
  double bytes = 0;
};

/// NOTE [rank memory]: a training rank's bytes at its peak. Its states, a
/// parameter (Φ the parameters, N the DP size; w = 4 bytes an element in
/// fp32, 2 in bf16, whose optimizer state adds the 4-byte masters):
///   ddp    weights w, gradients w, AdamW 8 (bf16: 12)
///   zero1  weights w, the flat gradients and their reduce-scattered shard
///          w + w/N, AdamW 8/N (12/N)
///   zero2  weights w, the shard's gradient sum w/N, AdamW 8/N (12/N); its
///          gradient buckets are a bounded extra (below)
///   zero3  all three sharded: (2w + 8)/N (bf16 16/N); a layer whole is a
///          bounded extra.
/// (The ZeRO paper's mixed-precision figures, 2 + 2 + 12 = 16 bytes a
/// parameter for ddp, are the bf16 rows.) Besides them it holds, at each
/// moment of a step (a ring reduce-scatter of n elements works in a copy
/// of its input and one incoming chunk: w·n + w·n/N; shown for fp32):
///   - the top of backward: one micro-batch's activations and the largest
///     parameter's gradient as autograd hands it over; zero2 also its first
///     gradient bucket (bucket_mb, at most the model) less the logits it
///     replaces (it is made as they go). zero3 keeps only each layer's input
///     of the layers' activations, and the rest-unit whole (4 · rest);
///   - zero1's gradient reduce-scatter (4·Φ + 4·Φ/N);
///   - zero3, a layer's backward: the layer inputs, its recomputed
///     activations and backward working set, the rest-unit whole, the head's
///     gradient, the layer gathered (4 · layer); then its reduce-scatter:
///     the layer whole, its gradients, their padded copy and this rank's
///     part, and the ring's buffers;
///   - zero3, the rest-unit's reduce-scatter after backward: the unit
///     whole, its gradients, their padded copy and part, the ring's buffers;
///   - the optimizer step: AdamW's denominator (4 bytes an element the rank
///     steps) or the gradient norm's double chunk (at most 1M elements);
///     in bf16 the step goes a 1M-element chunk at a time (8 bytes one);
///   - a rank that exports the weights (the policy's, for the weight sync):
///     the exported copy (w·Φ) and, under zero3, the largest unit gathered
///     (NOTE [export units]) — the export's spike.
/// The peak is the largest. Measured by the counting allocator within 5 %
/// (tests/actors/strategy_memory_test.cpp, bench/bench_strategies).
struct rank_memory {
  double weights = 0, gradients = 0, optimizer = 0;
  /// The moment of the peak, and what the rank holds then besides its
  /// states: activations (of the autograd graph) and buffers (gradients
  /// arriving, gathered units, collectives', the step's temporaries).
  std::string_view moment;
  double activations = 0, buffers = 0;
  double total() const { return weights + gradients + optimizer + activations + buffers; }
  /// The nonzero terms, largest first.
  std::vector<memory_term> terms() const;
};

/// `exports`: the rank copies the weights out (the stage's output, the
/// weight syncs); `exported` the elements it copies — 0: its own
/// parameters; under tensor parallelism the whole model's, gathered.
rank_memory training_rank_memory(dp_strategy s, int64_t dp, double bucket_mb,
                                 const parameter_split& params, const activation_split& activations,
                                 precision p = precision::fp32, bool exports = false,
                                 double exported = 0);

} // namespace troupe::actors::train
