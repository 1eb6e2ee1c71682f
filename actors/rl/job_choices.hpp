#pragma once
// The job file's own choices as enums, in a header light enough for the
// lean client (apps/console) — no LibTorch. Choices that belong to a lower
// folder (the KL estimator, loss aggregation, transport kinds, log levels)
// are declared there.

#include "actors/train/dp_strategy.hpp"
#include "runtime/enum_names.hpp"

#include <cstdint>

namespace troupe::actors::rl {

// The job file's choices (NOTE [enum names] in runtime/enum_names.hpp).

/// Terminal output: auto (a bar on a terminal, lines otherwise).
enum class progress_style : uint8_t { automatic, bar, lines, none };
TROUPE_ENUM_NAMES(progress_style, "auto", "bar", "lines", "none")

/// Where a stage's initial weights come from: the base model or an earlier
/// stage's output (named like the stage).
enum class model_source : uint8_t { base, sft, rm };
TROUPE_ENUM_NAMES(model_source, "base", "sft", "rm")

/// Fixed β, or adaptive towards a target KL (Ziegler et al.).
enum class kl_control : uint8_t { fixed, adaptive };
TROUPE_ENUM_NAMES(kl_control, "fixed", "adaptive")

/// KL as a reward penalty, or as a loss term.
enum class kl_place : uint8_t { reward, loss };
TROUPE_ENUM_NAMES(kl_place, "reward", "loss")

/// rule, a reward model, rule_weight·rule + model_weight·model, or a remote
/// RewardService (proto/troupe/v1/reward.proto).
enum class reward_kind : uint8_t { rule, model, mixed, remote };
TROUPE_ENUM_NAMES(reward_kind, "rule", "model", "mixed", "remote")

enum class algorithm_kind : uint8_t { ppo, grpo };
TROUPE_ENUM_NAMES(algorithm_kind, "ppo", "grpo")

/// Old log-probs from the policy's forward, or the rollout engine's.
enum class logprob_source : uint8_t { policy, engine };
TROUPE_ENUM_NAMES(logprob_source, "policy", "engine")

/// Who starts the worker processes.
enum class launcher_kind : uint8_t { automatic, local, nodes };
TROUPE_ENUM_NAMES(launcher_kind, "auto", "local", "nodes")

/// How a role's data-parallel ranks train (actors/train/dp_strategy.hpp).
using train::dp_strategy;
/// The dtype a role computes in (NOTE [mixed precision]).
using train::precision;

/// NOTE [placement modes] below.
enum class placement_mode : uint8_t { in_process, colocated, disaggregated, hybrid };
TROUPE_ENUM_NAMES(placement_mode, "in_process", "colocated", "disaggregated", "hybrid")

} // namespace troupe::actors::rl
