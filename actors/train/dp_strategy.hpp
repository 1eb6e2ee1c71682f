#pragma once
// How a training role's data-parallel ranks share the work (NOTE [training
// strategies] in actors/train/training_strategy.hpp), in a header light
// enough for the job file's choices (no LibTorch).

#include "runtime/enum_names.hpp"

#include <cstdint>

namespace troupe::actors::train {

/// ddp: replicas, gradients all-reduced; zero1: + the optimizer state
/// sharded; zero2: + the gradients; zero3: + the parameters at rest.
enum class dp_strategy : uint8_t { ddp, zero1, zero2, zero3 };
TROUPE_ENUM_NAMES(dp_strategy, "ddp", "zero1", "zero2", "zero3")

/// NOTE [strategy memory]: bytes a rank holds per fp32 parameter while
/// training under `s` over `dp` ranks, as the strategies are built (NOTE
/// [training strategies]): ddp the weights, the gradients and AdamW's two
/// moments (4 + 4 + 8); zero1 the weights, the flat gradients, the
/// reduce-scattered gradient shard and the moments of the shard (4 + 4 +
/// 4/N + 8/N); zero2 the weights, the shard's gradient sum and moments (4 +
/// 4/N + 8/N), its gradient buckets being a bounded extra (bucket_mb, not
/// per parameter); zero3 its shards of all three (16/N), a layer's whole
/// parameters and gradients and the embeddings' and head's being a bounded
/// extra (not per parameter of the model). At dp 1 every strategy holds
/// ddp's 16.
constexpr double training_bytes_per_parameter(dp_strategy s, int64_t dp) {
  const double n = dp < 1 ? 1.0 : static_cast<double>(dp);
  if (dp <= 1)
    return 16;
  switch (s) {
  case dp_strategy::zero1:
    return 4 + 4 + 4 / n + 8 / n;
  case dp_strategy::zero2:
    return 4 + 4 / n + 8 / n;
  case dp_strategy::zero3:
    return 16 / n;
  default:
    return 16;
  }
}

} // namespace troupe::actors::train
