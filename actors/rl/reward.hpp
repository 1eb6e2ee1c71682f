#pragma once
// The reward role: the weighted sum of its backends' scores (NOTE [reward
// backends] in reward_backend.hpp) as a detached actor.

#include "actors/rl/reward_backend.hpp"
#include "actors/rl/tasks.hpp"
#include "actors/rl/verifiers.hpp"
#include "actors/train/engine_actor.hpp"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace troupe::models {
class tokenizer;
} // namespace troupe::models

namespace troupe::actors::rl {

using reward_atom = caf::atom_constant<caf::atom("reward")>;

/// Answers "scores" [B] (fp32: Σ weight · backend scores), plus each
/// backend's scores under its key and its extras (weighted "token_scores",
/// "extra/<name>") (with the seconds it took: NOTE [busy on
/// replies]).
using reward_actor =
    caf::typed_actor<caf::replies_to<reward_atom, reward_request>::with<train::served_batch>,
                     /// Co-located offload: each backend frees what it holds (a reward
                     /// model's weights, to a file in the folder) until the next score;
                     /// answers the bytes freed (0 for a rule).
                     caf::replies_to<actors::release_atom, std::string>::with<train::served_bytes>,
                     caf::reacts_to<train::inject_failure_atom>,
                     caf::reacts_to<actors::inject_kill_atom, bool>>;

/// The response text for the rule: tokens up to the first EOS (exclusive),
/// special tokens skipped.
expected<std::string> response_text(const models::tokenizer& tok,
                                    const std::vector<int64_t>& tokens);

/// What a rule set says of each response: its weighted score and whether
/// its answer is right (1 or 0).
struct rule_outcome {
  std::vector<double> scores;
  std::vector<double> correct;
  /// 1 where the response matches every format rule; empty without one.
  std::vector<double> formatted;
};

/// The rules applied to responses (their tokens, cut at EOS) against
/// answers (sizes must match).
expected<rule_outcome> apply_rules(const models::tokenizer& tok, const rule_set& rules,
                                   const std::vector<std::vector<int64_t>>& responses,
                                   const std::vector<std::string>& answers);

/// Spawns the reward role over `backends` (at least one, distinct keys).
expected<reward_actor> spawn_reward(caf::actor_system& sys, std::vector<weighted_backend> backends);

} // namespace troupe::actors::rl

