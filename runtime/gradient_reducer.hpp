#pragma once
// Data-parallel gradient averaging over a c10d group, in buckets.
//
// NOTE [gradient buckets]: parameters are assigned to buckets in reverse
// order (the order backward produces their gradients), a bucket closing
// when adding the next parameter would exceed `bucket_bytes` or when the
// dtype changes; a parameter larger than a bucket gets one of its own. Each
// bucket's gradients are copied into one flat buffer (kept between steps),
// summed over the group with one all-reduce, scaled, and copied back, so
// there is one collective per bucket instead of one per parameter. A
// parameter without a gradient on this rank counts as zeros (and gets a
// zero gradient), so ranks that touched different parameters stay in step.
//
// Blocking: call from the thread that owns the parameters (a detached actor).

#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace troupe::runtime {

class process_group;

struct reducer_options {
  /// Upper bound of a bucket's flat buffer (a single larger parameter gets
  /// a bucket of its own). 25 MB, as in PyTorch's DDP.
  int64_t bucket_bytes = int64_t{25} << 20;
};

class gradient_reducer {
public:
  gradient_reducer();
  ~gradient_reducer();
  gradient_reducer(gradient_reducer&&) noexcept;
  gradient_reducer& operator=(gradient_reducer&&) noexcept;

  /// Buckets `params` (dense, floating, all on one device) for `group`,
  /// which must outlive the reducer.
  static expected<gradient_reducer> make(std::vector<at::Tensor> params, process_group& group,
                                         reducer_options options = {});

  /// Sums every parameter's gradient over the group in place and multiplies
  /// it by `scale` (1 / world size for an average of per-rank means).
  expected<void> all_reduce(double scale);

  /// Parameter indices of each bucket, in all-reduce order.
  const std::vector<std::vector<size_t>>& buckets() const;

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Broadcasts `params` in place from `root` (the start of data-parallel
/// training: every rank begins from the same weights), one flat buffer per
/// bucket of at most `bucket_bytes`.
expected<void> broadcast_parameters(std::vector<at::Tensor>& params, process_group& group,
                                    int root = 0, int64_t bucket_bytes = int64_t{25} << 20);

} // namespace troupe::runtime
