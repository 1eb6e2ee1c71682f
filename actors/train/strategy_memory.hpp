#pragma once
// The planner's bounded extras beside NOTE [strategy memory] (in
// actors/train/dp_strategy.hpp: the bytes a parameter), apart so that the
// job file's many includers do not rebuild when the planner's arithmetic
// changes.

#include "actors/train/dp_strategy.hpp"

#include <cstdint>

namespace troupe::actors::train {

/// What a rank holds besides training_bytes_per_parameter's, at the
/// strategy's peak (fp32): zero2 one gradient bucket of `bucket_mb`; zero3
/// the rest-unit (embeddings, final norm, head: `rest` parameters) whole
/// with its gradients through the step, and during a layer's backward that
/// layer (`layer` parameters) whole, its gradients, and their padded flat
/// copy for the reduce-scatter (NOTE [zero3 units]). None at dp 1.
constexpr double training_transient_bytes(dp_strategy s, int64_t dp, double bucket_mb,
                                          int64_t layer, int64_t rest) {
  if (dp <= 1)
    return 0;
  switch (s) {
  case dp_strategy::zero2:
    return bucket_mb * 1024 * 1024;
  case dp_strategy::zero3:
    return 8.0 * static_cast<double>(rest) + 12.0 * static_cast<double>(layer);
  default:
    return 0;
  }
}

} // namespace troupe::actors::train
