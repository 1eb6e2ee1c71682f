#pragma once
// NOTE [tensor parallelism]: Megatron's layout for the Llama model. A TP
// group of `size` ranks splits each block's work without gathering it:
//  - column-parallel (the output rows split): q, k, v (by heads) and the
//    MLP's gate and up projections (by the intermediate size); their input
//    passes through tp_copy, identity forward and all-reduce of the
//    gradient backward, since each rank's part of the input gradient is
//    partial;
//  - row-parallel (the input columns split): the attention output and the
//    MLP's down projection; their partial outputs are summed by tp_reduce,
//    all-reduce forward and identity backward, and their bias added after
//    the sum. One all-reduce per attention and one per MLP, forward and
//    backward alike;
//  - attention heads split evenly; key / value heads split when the group
//    size divides them, else every rank holds (replicated) all of them and
//    uses those its query heads read: their projection's output then
//    passes through tp_copy, so that each rank's wk / wv gradient is the
//    whole (equal on every rank);
//  - the vocabulary split into contiguous parts (sizes differ by at most
//    one): the embedding looks up the ids its part holds, zeroes the
//    others and tp_reduce sums the ranks' rows; the LM head is
//    column-parallel and answers this rank's part of the logits, which the
//    vocab-parallel log-probs take as they are (NOTE [vocab-parallel
//    log-probs] in kernels/logprobs.hpp). A tied embedding is its shard;
//  - norms, biases of row-parallel layers and the value / reward heads
//    (hidden → 1) are replicated; their inputs are equal on every rank, so
//    are their gradients.
// Parameters keep their troupe names; a rank's tensors are its parts
// (tp_slice_of says which). Every rank of the group runs the same passes on
// the same batch.

#include "models/config.hpp"
#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace troupe::runtime {
class process_group;
} // namespace troupe::runtime

namespace troupe::models {

/// This rank's share of a Llama model under TP (NOTE [tensor parallelism]).
struct tp_partition {
  int rank = 0, size = 1;
  /// Query heads [head0, head0 + heads).
  int64_t heads = 0, head0 = 0;
  /// Key / value heads held [kv0, kv0 + kv_heads): this rank's part when
  /// kv_split, else all of them.
  int64_t kv_heads = 0, kv0 = 0;
  bool kv_split = true;
  /// MLP rows [inter0, inter0 + intermediate).
  int64_t intermediate = 0, inter0 = 0;
  /// Vocabulary ids [vocab0, vocab0 + vocab).
  int64_t vocab = 0, vocab0 = 0;
  /// The TP group (null when size is 1).
  runtime::process_group* group = nullptr;

  bool active() const { return size > 1; }
};

/// Rank `rank`'s partition of `size`; invalid_argument naming the numbers
/// when the heads or the intermediate size are not divisible by it.
expected<tp_partition> partition_llama(const llama_config& c, int rank, int size);

/// The same over `group`'s ranks, keeping the group for the passes.
expected<tp_partition> partition_llama(const llama_config& c, runtime::process_group& group);

/// [begin, end) of part `rank` of `n` items over `size` contiguous parts
/// whose sizes differ by at most one.
std::pair<int64_t, int64_t> tp_range(int64_t n, int rank, int size);

/// How a parameter lies over the TP ranks: split along `dim` with this
/// rank's [begin, end), or replicated (dim -1).
struct tp_slice {
  int dim = -1;
  int64_t begin = 0, end = 0;
  bool replicated() const { return dim < 0; }
};

/// The slice of the parameter named `name` (troupe name) for `p`.
tp_slice tp_slice_of(const std::string& name, const llama_config& c, const tp_partition& p);

/// The whole parameter's shape from rank p's `part` shape.
std::vector<int64_t> tp_full_shape(const std::string& name, std::vector<int64_t> part,
                                   const llama_config& c, const tp_partition& p);

/// Rank p's parts of full parameters (by troupe name); not_found for a
/// name the model does not have.
expected<std::map<std::string, at::Tensor>>
tp_shard_weights(const std::map<std::string, at::Tensor>& full, const llama_config& c,
                 const tp_partition& p);

/// The whole parameter from every rank's part: each rank of p.group calls
/// it with its part of the same parameter, in the same order.
expected<at::Tensor> tp_gather_weight(const at::Tensor& part, const std::string& name,
                                      const llama_config& c, const tp_partition& p);

/// The most bytes tp_gather_weight holds at once for the parameter named
/// `name`, `whole_bytes` when whole (NOTE [sync staging]): the ranks' parts
/// gathered and, where they join along another dimension than the first or
/// differ in size, the whole joined again (and the padded part); 0 when
/// replicated (nothing is made).
int64_t tp_gather_peak_bytes(const std::string& name, const llama_config& c, const tp_partition& p,
                             int64_t whole_bytes);

/// Megatron's f: identity forward, gradient all-reduced over the group.
at::Tensor tp_copy(const at::Tensor& x, const tp_partition& p);
/// Megatron's g: all-reduce (sum) forward, identity backward.
at::Tensor tp_reduce(const at::Tensor& x, const tp_partition& p);
/// The ranks' `x` [..., n_r] joined along the last dimension in rank order
/// ([..., Σ n_r]; parts may differ in size by one, as tp_range cuts);
/// backward takes this rank's columns of the gradient.
at::Tensor tp_gather_last(const at::Tensor& x, int64_t total, const tp_partition& p);

} // namespace troupe::models
