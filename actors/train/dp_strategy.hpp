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

/// The dtype a training role computes in (NOTE [mixed precision] in
/// actors/train/strategy_parts.hpp): fp32 throughout, or bf16 weights,
/// activations and gradients with fp32 master weights and AdamW state.
enum class precision : uint8_t { fp32, bf16 };
TROUPE_ENUM_NAMES(precision, "fp32", "bf16")

} // namespace troupe::actors::train
