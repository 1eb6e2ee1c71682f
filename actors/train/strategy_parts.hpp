#pragma once
// Pieces the training strategies share (actors/train/training_strategy.cpp
// and zero3_strategy.cpp); internal to the train engine.

#include "actors/train/optimizer_options.hpp"
#include "actors/train/training_strategy.hpp"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace torch::serialize {
class InputArchive;
} // namespace torch::serialize

namespace troupe::actors::train::detail {

// torch's clip_grad_norm_ rule on a norm already computed.
inline double clip_coefficient(double norm, double max_norm) {
  return max_norm > 0 ? std::min(1.0, max_norm / (norm + 1e-6)) : 1.0;
}

// NOTE [flat AdamW]: AdamW over one flat tensor (a rank's shard, or the
// whole model), in torch::optim::AdamW's arithmetic: decoupled decay p ←
// p (1 − lr·wd), m ← β1 m + (1 − β1) g, v ← β2 v + (1 − β2) g², p ← p −
// lr / (1 − β1^t) · m / (sqrt(v) / sqrt(1 − β2^t) + eps). Element-wise, so
// a step of the shards is a step of the whole; its state is two tensors
// laid out like the flat parameters and one step count, which any DP size
// or strategy can cut into its own shards (NOTE [training strategies]).
//
// NOTE [mixed precision]: a role trained at `precision: bf16` holds its
// weights, gradients and activations in bf16, and AdamW keeps what it
// steps in fp32: a master copy of the rank's part of the weights (made
// from the bf16 weights at the first step, so every DP size and strategy
// starts from the same values) and both moments. The step widens the
// gradient a chunk at a time, updates the master exactly as the fp32 step
// updates the weights, and writes the master rounded to bf16 into the
// weights — the ZeRO paper's mixed-precision layout: 2 + 2 bytes a
// parameter of weights and gradients, 12 of optimizer state (K = 12).
struct flat_adam {
  optimizer_options o;
  at::Tensor m, v;   // undefined before the first step and while offloaded
  at::Tensor master; // fp32 weights of a narrower (bf16) p; undefined likewise
  int64_t t = 0;

  void step(at::Tensor p, const at::Tensor& g, double lr);

  int64_t bytes() const {
    auto size = [](const at::Tensor& x) {
      return x.defined() ? x.numel() * static_cast<int64_t>(x.element_size()) : int64_t{0};
    };
    return size(m) + size(v) + size(master);
  }

  /// Co-located offload: the moments and master to `path` (when there are
  /// any) and freed; answers the bytes freed. reload reads them back.
  int64_t offload(const std::string& path);
  void reload(const std::string& path);

  /// A training state's optimizer part, whole-model and unpadded (NOTE
  /// [flat AdamW]); undefined where the state has none (before the first
  /// step; a master only for narrow weights).
  struct whole_state {
    at::Tensor exp_avg, exp_avg_sq, master;
  };
  /// Reads it for weights of `weights` dtype and `total` elements: sets t,
  /// converts the moments to the dtype AdamW keeps for such weights (a
  /// state saved at another precision loads); an error when they do not fit.
  expected<whole_state> read_state(torch::serialize::InputArchive& archive, int64_t total,
                                   at::ScalarType weights);
};

/// Whether weights of this dtype are stepped through an fp32 master (NOTE
/// [mixed precision]).
inline bool has_master(at::ScalarType weights) {
  return weights == at::kBFloat16 || weights == at::kHalf;
}

/// The dtype of AdamW's state for weights of `weights` dtype.
inline at::ScalarType optimizer_dtype(at::ScalarType weights) {
  return has_master(weights) ? at::kFloat : weights;
}

/// NOTE [tensor-parallel norm]: under tensor parallelism a rank's
/// gradient holds its parts of the split parameters and the whole of the
/// replicated ones (equal on every TP rank). The global norm sums the split
/// parts' squares over the TP group and counts the replicated ones once.
/// Under pipeline parallelism each stage holds other parameters: the
/// stages' squares add up over the PP group, less what a stage holds that
/// another counts (the last stage's copy of a tied embedding).
struct tp_norm {
  runtime::process_group* group = nullptr; // null: no TP
  /// [begin, end) of `grads`' elements that belong to replicated parameters.
  std::vector<std::pair<int64_t, int64_t>> replicated;
  runtime::process_group* pp = nullptr; // null: no PP
  /// [begin, end) of `grads`' elements another stage counts (split over TP
  /// like the rest, never replicated).
  std::vector<std::pair<int64_t, int64_t>> elsewhere;

  /// The lines' groups, no ranges yet.
  static tp_norm of(const model_lines& lines) { return {lines.tp, {}, lines.pp, {}}; }

  /// Parameter i at [offset, offset + n) of a layout, of which this rank's
  /// [lo, hi) starts at `at` in `grads`: its part there joins `replicated`
  /// or `elsewhere` as `lines` flags it.
  void add(const model_lines& lines, size_t i, int64_t at, int64_t lo, int64_t hi, int64_t offset,
           int64_t n) {
    auto put = [&](std::vector<std::pair<int64_t, int64_t>>& ranges) {
      const int64_t b = std::max(lo, offset), e = std::min(hi, offset + n);
      if (b < e)
        ranges.emplace_back(at + b - lo, at + e - lo);
    };
    if (lines.tp && i < lines.tp_replicated.size() && lines.tp_replicated[i])
      put(replicated);
    if (lines.pp && i < lines.pp_elsewhere.size() && lines.pp_elsewhere[i])
      put(elsewhere);
  }
};

/// The norm of the whole gradient of which `grads` is this rank's part
/// (squared norms summed over `group`; null: all of it here; and over the
/// TP group as `tp` says), and `grads` scaled by torch's clip_grad_norm_
/// rule when it is above `max_norm`.
expected<double> clip_by_global_norm(at::Tensor& grads, runtime::process_group* group,
                                     double max_norm, const tp_norm& tp = {});

/// The sum of squares of `g`'s elements, in double, a chunk at a time (no
/// whole-size double copy: that was 3x the gradients at a step's peak).
double squared_norm(const at::Tensor& g);

/// zero3 (actors/train/zero3_strategy.cpp) over `group`; `layers` holds the
/// indices into `params` of each layer's parameters (NOTE [layer hooks]).
expected<std::unique_ptr<training_strategy>>
make_zero3_strategy(std::vector<at::Tensor> params, std::vector<std::vector<size_t>> layers,
                    const optimizer_options& optim, runtime::process_group& group,
                    model_lines lines = {});

} // namespace troupe::actors::train::detail
