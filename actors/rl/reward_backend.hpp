#pragma once
// What scores responses for the reward role.
//
// NOTE [reward backends]: the rl stage's reward role (reward.hpp) sums the
// weighted scores of its backends: the rule on the decoded response, a
// reward model, or any other implementation of reward_backend — a later
// remote service lives in cluster/ and is handed in through a factory
// (role_factories in roles.hpp: run_options for the driver's process, the
// role host for workers), so actors/ never includes gRPC. The built-in
// factory reads rl.reward: kind rule (the rule at rule_weight), model (the
// model at model_weight) or mixed (both, the rule first); the rule part is
// rl.reward.rules (NOTE [verifiable rewards]), or the built-in tasks' rule. Each backend's
// scores appear in the reply under its key ("rule_scores", "model_scores").

#include "actors/rl/tasks.hpp"
#include "actors/rl/verifiers.hpp"
#include "runtime/error.hpp"
#include "runtime/tensor_batch.hpp"

#include <ATen/core/Tensor.h>

#include <caf/meta/type_name.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::models {
class tokenizer;
} // namespace troupe::models

namespace troupe::actors::train {
class train_engine;
} // namespace troupe::actors::train

namespace troupe::actors::rl {

/// What the reward role scores: the full sequences (for a reward model) and,
/// per row, the generated tokens and the reference answer (for the rule).
struct reward_request {
  runtime::tensor_batch batch; ///< input_ids, attention_mask [B, L]
  std::vector<std::vector<int64_t>> responses;
  std::vector<std::string> answers;
  /// Per row: the prompt's tokens, and the row's metadata JSON ("" = none).
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::string> metadata;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, reward_request& x) {
  return f(caf::meta::type_name("reward_request"), x.batch, x.responses, x.answers, x.prompts,
           x.metadata);
}

/// One source of scores. Called from the reward actor only (one call at a
/// time); may block.
class reward_backend {
public:
  virtual ~reward_backend() = default;
  /// The key its scores are reported under ("rule_scores").
  virtual std::string_view key() const = 0;
  /// One fp32 score per response of `req` ([B]).
  virtual expected<at::Tensor> score(const reward_request& req) = 0;
  /// What its last score() found besides the scores, reported in the
  /// role's reply: per-token scores ("token_scores" [B, Lr], Lr = the
  /// longest response), named numbers ("extra/<name>" [B]). Empty by default.
  virtual runtime::tensor_batch extras() { return {}; }
  /// Co-located offload: frees what it holds to files in `dir` until its
  /// next score; answers the bytes freed (0: nothing to free).
  virtual expected<int64_t> release(const std::string& dir) { return int64_t{0}; }
};

/// A backend and the weight of its scores in the sum.
struct weighted_backend {
  std::unique_ptr<reward_backend> backend;
  double weight = 1.0;
};

/// The rules on the decoded response against the answer.
std::unique_ptr<reward_backend> make_rule_backend(std::shared_ptr<const models::tokenizer> tok,
                                                  rule_set rules);
/// A scalar reward model (a train engine with a reward head).
std::unique_ptr<reward_backend> make_model_backend(std::unique_ptr<train::train_engine> model);

} // namespace troupe::actors::rl
