#pragma once
// The data of a job: the built-in task's splits or dataset files, the order in
// which batches draw from them, and collation of token sequences into the
// tensor batches of NOTE [sequence batches] (actors/train/train_engine.hpp).

#include "actors/rl/datasets.hpp"
#include "actors/rl/job_config.hpp"
#include "actors/rl/tasks.hpp"
#include "runtime/seeded_random.hpp"
#include "runtime/tensor_batch.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace troupe::models {
class tokenizer;
} // namespace troupe::models

namespace troupe::actors::rl {

struct job_data {
  row_table<example> train;
  std::vector<example> eval;
  row_table<demonstration> sft;
  row_table<preference_pair> preferences;
  /// Held-out pairs (from the eval examples) for the reward model's accuracy.
  std::vector<preference_pair> eval_preferences;
  /// What loading dropped, for the job's log ("data.train_file: 3 of 100
  /// prompts dropped: ...").
  std::vector<std::string> notes;
  /// Conversations whose template renders were not append-only (NOTE
  /// [prefix check]); the metric data/template_divergences.
  int64_t template_divergences = 0;
};

/// What the length filter measures rows with: the tokens of a row's prompt
/// (its text, or its conversation's JSON) and of a response (EOS included).
/// Rows that cannot fit the context are dropped and counted: prompts when
/// prompt + max_new_tokens > context, demonstrations and preference pairs
/// when prompt + response does. `context` 0 = no filter.
struct data_limits {
  std::function<expected<int64_t>(const std::string& prompt, const std::string& messages)>
      prompt_tokens;
  std::function<int64_t(const std::string& response)> response_tokens;
  /// A multi-turn demonstration's whole sequence (NOTE [demonstration turns]).
  std::function<expected<int64_t>(const demonstration& d)> demonstration_tokens;
  int64_t context = 0;
  int64_t max_new_tokens = 0;
};

/// Which derived splits a job needs: without an sft_file / preference_file,
/// the sft / rm stage's rows come from the train rows.
struct data_needs {
  bool sft = true;
  bool rm = true;
};

/// Builds every split the job's stages need from `c` (files win over the
/// task; NOTE [dataset files]).
expected<job_data> load_job_data(const data_config& c, const data_limits& limits = {},
                                 data_needs needs = {});

/// Checks every file `c` names (each row, as the job reads it) without
/// holding them: a line per file ("data.train_file: <path>: 1000 rows"), or
/// the first malformed row's error.
expected<std::vector<std::string>> check_data_files(const data_config& c);

/// Rows start .. start+count-1 of an endless stream over [0, n): epoch e is a
/// permutation of [0, n) drawn from (seed, e). A pure function, so a data
/// position is just a row count.
std::vector<int64_t> batch_indices(int64_t n, uint64_t seed, int64_t start, int64_t count);

/// Seeds per request and stream (runtime/seeded_random.hpp).
using runtime::mix_seed;

/// BOS (when the tokenizer has one) + the prompt's tokens.
std::vector<int64_t> encode_prompt(const models::tokenizer& tok, const std::string& prompt);

/// NOTE [prompt encoding]: how a job turns a row's prompt into tokens. A
/// plain prompt is BOS + its text's tokens; a conversation (a row's
/// messages), or a plain prompt as one user message when
/// data.chat_template is set, is rendered by the tokenizer's chat template
/// (tokenizer_config.json) with add_generation_prompt, exactly as
/// transformers' apply_chat_template renders it, and the text tokenised as
/// it is (the template writes any BOS; special-token texts become their
/// ids). A response is its tokens + EOS.
class prompt_encoder {
public:
  prompt_encoder() = default;
  prompt_encoder(std::shared_ptr<const models::tokenizer> tok, bool template_plain_prompts);

  /// The tokens of a row's prompt (`messages`: its conversation's JSON, ""
  /// for a plain prompt); an error when a conversation meets a tokenizer
  /// without a usable chat template, or the template fails.
  expected<std::vector<int64_t>> prompt(const std::string& text, const std::string& messages) const;
  /// The rendered text of a conversation (the JSON of its messages).
  expected<std::string> render(const std::string& messages, bool add_generation_prompt) const;
  /// The same from parsed messages, with tool schemas (null = none).
  expected<std::string> render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                               const nlohmann::ordered_json& tools) const;
  /// Whether plain prompts go through the chat template as one user message.
  bool templates_plain_prompts() const { return template_plain_; }
  /// The response's tokens + EOS.
  std::vector<int64_t> response(const std::string& text) const;

  /// NOTE [prefix check]: where rendering a conversation turn by turn stops
  /// being append-only — the render of messages [0, k) (with the
  /// generation prompt when message k is the assistant's) is not a prefix
  /// of the render of [0, k], the template having rewritten earlier text
  /// (Qwen3's drops earlier turns' <think> blocks). nullopt when every
  /// render extends the one before.
  struct divergence {
    size_t turn = 0;           ///< the message whose addition rewrote earlier text
    size_t byte = 0;           ///< the first byte where the two renders differ
    std::string before, after; ///< a few bytes from there, in each
  };
  expected<std::optional<divergence>> divergence_of(const std::string& messages) const;

  const models::tokenizer& tokenizer() const { return *tok_; }

private:
  std::shared_ptr<const models::tokenizer> tok_;
  bool template_plain_ = false;
};
/// NOTE [prefix check]: the job's conversations — the first
/// kPrefixCheckRows of each of its files, an SFT row with its response as
/// the final assistant turn — rendered turn by turn with the model's chat
/// template: how many were checked, how many are not append-only, and where
/// the first one departs ("data.train_file row 3: turn 2 (user) rewrites
/// earlier text from byte 118: ...").
inline constexpr int64_t kPrefixCheckRows = 1000;
struct prefix_report {
  int64_t checked = 0;
  int64_t divergent = 0;
  std::string first;
};
expected<prefix_report> check_prefixes(const prompt_encoder& enc, const data_config& c,
                                       const job_data& d);

/// The response's tokens + EOS (when the tokenizer has one).
std::vector<int64_t> encode_response(const models::tokenizer& tok, const std::string& response);

/// Prompt + response rows, right-padded with `pad`: input_ids, attention_mask
/// [B, L] and response_mask [B, L-1] (fp32). Every prompt must be non-empty.
expected<runtime::tensor_batch> collate_sequences(const std::vector<std::vector<int64_t>>& prompts,
                                                  const std::vector<std::vector<int64_t>>& responses,
                                                  int64_t pad);

/// Per-response-token values (e.g. the engine's log-probs) placed into the
/// shifted [B, L-1] layout of collate_sequences (0 elsewhere).
at::Tensor scatter_response_values(const std::vector<std::vector<int64_t>>& prompts,
                                   const std::vector<std::vector<float>>& values, int64_t length);

/// Preference pairs: chosen_ids/chosen_mask/rejected_ids/rejected_mask [B, L]
/// padded to one length.
expected<runtime::tensor_batch> collate_pairs(const std::vector<std::vector<int64_t>>& chosen,
                                              const std::vector<std::vector<int64_t>>& rejected,
                                              int64_t pad);

/// NOTE [preference batches]: a DPO batch of B pairs holds each side's
/// chosen_ids / rejected_ids, chosen_mask / rejected_mask [B, L] and
/// chosen_response_mask / rejected_response_mask [B, L-1] (one width for
/// both sides), and the reference's "ref_chosen_logps",
/// "ref_rejected_logps" [B]. From a sequence batch (collate_sequences) of 2B
/// rows — every chosen sequence, then every rejected one — this makes all
/// but the reference's log-probs.
expected<runtime::tensor_batch> preference_layout(const runtime::tensor_batch& sequences,
                                                  int64_t pairs);

} // namespace troupe::actors::rl
