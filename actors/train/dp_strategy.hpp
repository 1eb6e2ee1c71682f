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

} // namespace troupe::actors::train
