#pragma once
// The reward role: a rule on the decoded response (built-in tasks), a scalar
// reward model, or a weighted sum of both, as a detached actor.

#include "actors/rl/job_choices.hpp"
#include "actors/rl/tasks.hpp"
#include "actors/train/engine_actor.hpp"

#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace troupe::models {
class tokenizer;
} // namespace troupe::models

namespace troupe::actors::rl {

/// What the reward role scores: the full sequences (for a reward model) and,
/// per row, the generated tokens and the reference answer (for the rule).
struct reward_request {
  runtime::tensor_batch batch; ///< input_ids, attention_mask [B, L]
  std::vector<std::vector<int64_t>> responses;
  std::vector<std::string> answers;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, reward_request& x) {
  return f(caf::meta::type_name("reward_request"), x.batch, x.responses, x.answers);
}

struct reward_spec {
  reward_kind kind = reward_kind::rule;
  rule_kind rule = rule_kind::positional;
  double rule_weight = 1.0;
  double model_weight = 1.0;
};

using reward_atom = caf::atom_constant<caf::atom("reward")>;

/// Answers "scores" [B] (fp32), plus "rule_scores" and / or "model_scores"
/// (with the seconds it took: NOTE [busy on replies]).
using reward_actor = caf::typed_actor<
    caf::replies_to<reward_atom, reward_request>::with<train::served_batch>,
    /// Co-located offload: the reward model's weights to a file in the
    /// folder until the next score; answers the bytes freed (0 for a rule).
    caf::replies_to<actors::release_atom, std::string>::with<train::served_bytes>,
    caf::reacts_to<train::inject_failure_atom>>;

/// The response text for the rule: tokens up to the first EOS (exclusive),
/// special tokens skipped.
expected<std::string> response_text(const models::tokenizer& tok,
                                    const std::vector<int64_t>& tokens);

/// Rule scores of responses against answers (sizes must match).
expected<std::vector<double>> rule_scores(const models::tokenizer& tok, rule_kind rule,
                                          const std::vector<std::vector<int64_t>>& responses,
                                          const std::vector<std::string>& answers);

/// Spawns the reward role; `model` is required for kinds model and mixed.
expected<reward_actor> spawn_reward(caf::actor_system& sys, const reward_spec& spec,
                                    std::shared_ptr<const models::tokenizer> tok,
                                    std::unique_ptr<train::train_engine> model);

} // namespace troupe::actors::rl

