#pragma once
// Built-in tasks with a rule reward: digit sorting and multi-digit addition.
// Examples are generated deterministically from a seed (the same seed gives
// the same examples on every machine: splitmix64, no std distributions), and
// a task derives SFT demonstrations and preference pairs from its examples.
// Torch-free.
//
// Formats (one character per token with the byte tokenizer):
//   sort: prompt "sort:5031=", answer "0135"
//   add:  prompt "add:482+97=", answer "579"
// A response is scored against the answer by a rule (rule_kind), on a 0–1
// scale; the response is cut at its first EOS by the caller (text only here).

#include "runtime/enum_names.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::actors::rl {

/// A prompt and its reference answer.
/// (Rows read from files may hold a conversation instead of a plain prompt:
/// `messages` is then its JSON array, [{"role": ..., "content": ...}, ...],
/// which the model's chat template renders, and `prompt` its last user
/// message, for display.)
struct example {
  std::string prompt;
  std::string answer;
  std::string messages;
  /// The row's metadata for the reward, as JSON ("" = none).
  std::string metadata;
  bool operator==(const example&) const = default;
};

/// A prompt and a demonstration (SFT data).
/// (A multi-turn demonstration — a tool-using episode — also has `turns`:
/// the JSON array of the messages after the prompt, assistant turns with
/// their tool calls and the tool messages between them, the last an
/// assistant answer, which `response` repeats; and `tools`, the JSON array
/// of the tools offered, "" = none. NOTE [demonstration turns] in
/// episodes.hpp says how they become tokens.)
struct demonstration {
  std::string prompt;
  std::string response;
  std::string messages;
  std::string turns;
  std::string tools;
  bool operator==(const demonstration&) const = default;
};

/// A prompt with a preferred and a dispreferred response (reward-model data).
struct preference_pair {
  std::string prompt;
  std::string chosen;
  std::string rejected;
  std::string messages;
  bool operator==(const preference_pair&) const = default;
};

/// How a response is scored against the reference answer.
enum class rule_kind : uint8_t {
  /// 1 if the response equals the answer, else 0.
  exact,
  /// Characters equal at the same position / max(answer length, response
  /// length): 1 for an exact answer, partial credit otherwise, 0 for empty.
  positional,
  /// Verifiable rules (NOTE [verifiable rewards] in verifiers.hpp): the
  /// extracted answer is numerically equivalent; it matches the row's answer
  /// read as a regex; the response has a format; DAPO's overlong penalty.
  math,
  regex,
  format,
  overlong,
};
TROUPE_ENUM_NAMES(rule_kind, "exact", "positional", "math", "regex", "format", "overlong")

/// Parses a rule_kind name; invalid_argument listing them all otherwise.
expected<rule_kind> parse_rule_kind(std::string_view name);

/// The built-in tasks.
enum class task_kind : uint8_t { sort, add };
TROUPE_ENUM_NAMES(task_kind, "sort", "add")

/// The score of `response` against `answer` by exact or positional, in
/// [0, 1] (the other kinds: rule_set in verifiers.hpp).
double rule_score(rule_kind kind, std::string_view answer, std::string_view response);

/// Options of the built-in tasks.
struct task_options {
  task_kind name = task_kind::sort;
  /// sort: digits per prompt; add: digits per operand (each drawn uniformly
  /// in [min_digits, max_digits]).
  int64_t min_digits = 3;
  int64_t max_digits = 6;
};

/// Checks the name and 1 <= min_digits <= max_digits <= 32; messages name
/// the field ("task.min_digits: ...").
expected<void> validate(const task_options& opts);

/// A built-in task.
class task {
public:
  virtual ~task() = default;
  virtual std::string_view name() const = 0;
  /// Example `index` of the stream `seed` (pure function of both).
  virtual example make_example(uint64_t seed, int64_t index) const = 0;
  /// The longest prompt this task makes, in characters.
  virtual int64_t max_prompt_length() const = 0;
  /// A plausible wrong answer for `ex` (for rejected responses), never equal
  /// to ex.answer; deterministic in (seed, index).
  virtual std::string wrong_answer(const example& ex, uint64_t seed, int64_t index) const = 0;
};

/// The task named by opts.name (validated).
expected<std::unique_ptr<task>> make_task(const task_options& opts);

/// Train and held-out examples: `train_size` examples from the seed's train
/// stream, then `eval_size` from its eval stream whose prompts are not among
/// the train prompts (no leak; invalid_argument if the task cannot produce
/// that many distinct held-out prompts within a bounded number of draws).
struct task_splits {
  std::vector<example> train;
  std::vector<example> eval;
};
expected<task_splits> make_splits(const task& t, uint64_t seed, int64_t train_size,
                                  int64_t eval_size);

/// SFT data: each example's prompt with its answer as the response.
std::vector<demonstration> to_demonstrations(const std::vector<example>& examples);

/// Preference data: chosen = the answer, rejected = t.wrong_answer(...).
std::vector<preference_pair> to_preferences(const task& t, const std::vector<example>& examples,
                                            uint64_t seed);

} // namespace troupe::actors::rl
