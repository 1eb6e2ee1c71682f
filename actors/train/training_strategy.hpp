#pragma once
// How a training engine's data-parallel ranks hold and update the model: one
// interface over the DP dimension, one implementation per dp_strategy.
//
// NOTE [training strategies]: the engine's step is the same under every
// strategy —
//   zero_grad; backward of the rank's weighted loss (NOTE [data-parallel
//   training]); sync_gradients; clip_gradients; step(lr)
// — and each strategy decides what a rank holds:
//   ddp    every rank a replica of the parameters, the gradients and the
//          AdamW state; sync_gradients all-reduces the gradients in buckets
//          (NOTE [gradient buckets]); every rank steps the whole model.
//   zero1  the parameters live in one flat buffer, padded to a multiple of
//          the DP size and cut into equal shards, one a rank; the AdamW
//          state exists for the rank's shard only (1/N of it); the
//          gradients are reduce-scattered into the rank's shard, the rank
//          steps its shard, and the shards are all-gathered back into every
//          rank's flat buffer (the parameters are views into it). AdamW is
//          element-wise, so a sharded step is the replicated one.
//   zero2  zero1's layout without the whole gradient: backward's gradients
//          go into buckets that are reduced to their owners and freed as
//          they fill (NOTE [zero2 buckets] in the .cpp); each rank keeps
//          only its shard's sum.
//   zero3  zero2's sharded gradients and optimizer state, and the
//          parameters too: a rank holds its shard of each unit (one a
//          transformer layer, one for the rest) at rest, a layer is
//          gathered for its forward and again for its backward, which
//          recomputes it (NOTE [zero3 units] in zero3_strategy.cpp).
// Both keep the parameters in a flat buffer with flat gradients (views the
// backward accumulates into) and step them with one flat AdamW (NOTE [flat
// AdamW]), so a training state saved under one strategy and DP size loads
// under any other.
// The gradient norm is the whole gradient's whatever the strategy (a
// sharded one all-reduces its shards' squared norms) and clipping follows
// torch's clip_grad_norm_: scale by max_norm / (norm + 1e-6) when below 1.
//
// Blocking: every call that communicates must be made by every rank of the
// group in the same order (the engine's actor thread).

#include "actors/train/dp_strategy.hpp"
#include "actors/train/optimizer_options.hpp"
#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torch::serialize {
class InputArchive;
class OutputArchive;
} // namespace torch::serialize

namespace troupe::runtime {
class process_group;
}

namespace troupe::models {
class layer_hooks;
}

namespace troupe::actors::train {

/// The model-parallel lines a strategy over the DP group needs for the
/// global gradient norm (NOTE [tensor-parallel norm] in strategy_parts.hpp).
struct model_lines {
  /// Tensor parallelism: the TP group, and per parameter whether it is
  /// replicated over it (empty: none is). The DP group is one line of the
  /// mesh, the TP group another (zero3 shards each TP rank's part over its
  /// DP line).
  runtime::process_group* tp = nullptr;
  std::vector<bool> tp_replicated;
  /// Pipeline parallelism: the PP group, over which the stages' gradient
  /// norms add up (NOTE [pipeline parallelism] in
  /// models/pipeline_parallel.hpp), and per parameter whether another stage
  /// counts it (empty: none; the last stage's copy of a tied embedding:
  /// NOTE [tied embedding under PP] in train_engine.cpp). zero3 shards a
  /// stage's layers and its rest over its DP line.
  runtime::process_group* pp = nullptr;
  std::vector<bool> pp_elsewhere;
};

struct strategy_options {
  dp_strategy kind = dp_strategy::ddp;
  /// ddp's all-reduce bucket (NOTE [gradient buckets]).
  double bucket_mb = 25;
  model_lines lines;
};

class training_strategy {
public:
  /// The strategy for a model's trainable `params` (registration order; one
  /// dtype and device) over `group` (null: one rank, nothing shared). The
  /// parameters must already be equal on every rank.
  /// `layers`: the indices into `params` of each transformer layer's
  /// parameters (zero3 shards and gathers them a layer at a time; the rest
  /// is one more unit).
  static expected<std::unique_ptr<training_strategy>>
  make(std::vector<at::Tensor> params, const optimizer_options& optim,
       runtime::process_group* group, const strategy_options& options,
       std::vector<std::vector<size_t>> layers = {});
  virtual ~training_strategy();

  virtual dp_strategy kind() const = 0;

  /// Clears the gradients before a step's backward.
  virtual void zero_grad() = 0;
  /// Whether the gradients are reduced during backward (zero2, zero3): then
  /// every rank runs as many backward passes in a step as the others (a
  /// rank with fewer micro-batches runs its last again at weight 0) and
  /// calls backward_done after each.
  virtual bool reduces_in_backward() const { return false; }
  virtual expected<void> backward_done() { return {}; }
  /// After the step's backward passes: the gradients summed over the group,
  /// as far as this rank keeps them (ddp: all of them; zero: its shard).
  virtual expected<void> sync_gradients() = 0;
  /// The norm of the whole synced gradient; scaled to `max_norm` when it is
  /// larger (0: never).
  virtual expected<double> clip_gradients(double max_norm) = 0;
  /// One AdamW step at `lr` of what this rank updates; every rank holds the
  /// full new parameters afterwards.
  virtual expected<void> step(double lr) = 0;

  /// The model's hooks (NOTE [layer hooks] in models/llama.hpp) when the
  /// strategy takes part in its passes (zero3), else null.
  virtual models::layer_hooks* layer_hooks() { return nullptr; }
  /// Makes every parameter whole on this rank (zero3 gathers its shards:
  /// every rank calls it; the others hold them whole already), and frees
  /// them again; with `keep_changes` what was written into the whole
  /// parameters since becomes the rank's shards.
  virtual expected<void> gather_parameters() { return {}; }
  virtual void release_parameters(bool keep_changes) { (void)keep_changes; }

  /// NOTE [export units]: the parameters as groups a rank can make whole
  /// one at a time — zero3's units (each layer, then the rest), else one
  /// group of them all (whole already) — as indices into make()'s params.
  /// An export gathers them in this order, copies and frees each, so its
  /// spike beyond the exported copy is the largest unit, not the model.
  virtual std::vector<std::vector<size_t>> export_units() const = 0;
  /// Makes unit u whole on this rank (zero3 all-gathers it: every rank
  /// calls it, in the same order), and frees it again.
  virtual expected<void> gather_unit(size_t u) {
    (void)u;
    return {};
  }
  virtual void release_unit(size_t u) { (void)u; }

  /// Bytes of optimizer state this rank holds.
  virtual int64_t optimizer_bytes() const = 0;
  /// Co-located offload: writes the optimizer state this rank holds to
  /// `path` (when there is any) and frees it and the gradient buffers;
  /// answers the bytes freed. reload_state reads the file back (the same
  /// rank, the same strategy); the next zero_grad makes new gradients.
  virtual expected<int64_t> release(const std::string& path) = 0;
  virtual expected<void> reload_state(const std::string& path) = 0;
  /// The optimizer state into / from a training-state archive, in one layout
  /// whatever the strategy and DP size (NOTE [flat AdamW] in the .cpp): the
  /// whole model's moments and the step count. Saving gathers the shards:
  /// every rank of the group calls it.
  virtual expected<void> save_state(torch::serialize::OutputArchive& archive) const = 0;
  virtual expected<void> load_state(torch::serialize::InputArchive& archive) = 0;
  /// NOTE [peer state]: what save_state writes, by key, without a
  /// collective — views of the live state, valid until the next step —
  /// where a rank holds the whole state (ddp); errc::unsupported elsewhere.
  virtual expected<std::vector<std::pair<std::string, at::Tensor>>> whole_state() const {
    return make_error(errc::unsupported,
                      "whole_state: this rank holds a shard of the optimizer state");
  }

  /// NOTE [sharded state]: this rank's part of the training state in the
  /// canonical layout — the parameters in order, unpadded, end to end —
  /// as (offset, length) segments of it and their values: the weights and
  /// AdamW's moments (undefined before the first step). Rank r of N writes
  /// about a 1/N of the whole and no rank gathers: the flat strategies the
  /// r-th 1/N of the layout (ddp's ranks split what each holds whole),
  /// zero3 its shard of every unit, up to two segments a parameter; with
  /// bf16 weights also their fp32 masters (after the first step).
  struct shard {
    std::vector<int64_t> segments; // offset, length, offset, length, ...
    at::Tensor params, exp_avg, exp_avg_sq, master;
    int64_t step = 0;
    int64_t total = 0; // elements of the canonical layout
  };
  virtual expected<shard> state_shard() const = 0;
};

} // namespace troupe::actors::train
