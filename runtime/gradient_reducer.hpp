#pragma once
// Bucketed parameter broadcast over a c10d group: the start of
// data-parallel training, every rank beginning from rank 0's weights.
//
// NOTE [gradient buckets]: parameters are assigned to buckets in reverse
// order (the order backward produces their gradients), a bucket closing
// when adding the next parameter would exceed `bucket_bytes` or when the
// dtype changes; a parameter larger than a bucket gets one of its own. (The
// training strategies sum gradients in their flat buffers:
// actors/train/training_strategy.cpp.)
//
// Blocking: call from the thread that owns the parameters (a detached actor).

#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace troupe::runtime {

class process_group;

/// Broadcasts `params` in place from `root` (the start of data-parallel
/// training: every rank begins from the same weights), one flat buffer per
/// bucket of at most `bucket_bytes`.
expected<void> broadcast_parameters(std::vector<at::Tensor>& params, process_group& group,
                                    int root = 0, int64_t bucket_bytes = int64_t{25} << 20);

} // namespace troupe::runtime
