#pragma once
// Verifiable rule rewards: final-answer extraction, numeric equivalence, and
// the rules a job combines with weights (rl.reward.rules). Torch-free.
//
// NOTE [verifiable rewards]
// Extraction (answer_extract) follows the semantics users know from verl's
// math rewards:
//   strict    GSM8K: the last "#### " followed by -?[0-9.,]+ (commas dropped);
//   flexible  the last number anywhere (-?[0-9.,]+ containing a digit);
//   boxed     the content of the last \boxed{...} (nested braces matched;
//             \fbox{...} when there is no \boxed; "\boxed 5" up to a '$');
//   none      the whole response.
// Equivalence (answers_equivalent) first normalises both sides (surrounding
// $...$, \( \), \[ \], \text{} / \mbox{} unwrapped, \left \right and LaTeX
// spacing dropped, \dfrac / \tfrac as \frac, a trailing '.', degrees), then
// compares them as exact rationals when both read as numbers — integers,
// decimals, thousands separators ("1,234"), negatives, scientific notation,
// \frac{a}{b}, \frac12, a/b, and percentages ("50%" equals both 50 and 0.5)
// — and as normalised strings otherwise. A ground-truth answer may itself
// hold "#### 42" or \boxed{42} (a GSM8K solution, a MATH solution): its
// final answer is extracted the same way first.
//
// Rules (rule_kind) score one response in [0, 1] (overlong in [-penalty, 0]):
//   exact       the extracted answer equals the ground truth byte for byte;
//   positional  characters equal at the same position / the longer length;
//   math        extraction + equivalence (1 or 0);
//   regex       the extracted answer fully matches the ground truth read as a
//               Python-syntax regex (a row's answer "4[2-3]" accepts 42, 43);
//   format      the whole response fully matches `pattern` (Python syntax,
//               '.' matching newlines too): 1 or 0;
//   overlong    DAPO's soft overlong punishment: 0 up to max_length − buffer
//               tokens, then falling linearly to −penalty at max_length.
// A rule_set sums its rules' weighted scores; its accuracy (val/accuracy) is
// the first answer-checking rule's verdict (exact, positional read as exact,
// math, regex), or exact match of the whole response when it has none.

#include "actors/rl/tasks.hpp"
#include "models/regex.hpp"
#include "runtime/enum_names.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::actors::rl {

/// How a final answer is taken out of a response.
enum class answer_extract : uint8_t { none, strict, flexible, boxed };
TROUPE_ENUM_NAMES(answer_extract, "none", "strict", "flexible", "boxed")

/// The final answer of `text` by `mode`; nullopt where it has none.
std::optional<std::string> extract_answer(answer_extract mode, std::string_view text);

/// The content of the last \boxed{...} (or \fbox{...}) of `text`.
std::optional<std::string> last_boxed(std::string_view text);

/// `text` normalised for comparison (see the note).
std::string normalize_answer(std::string_view text);

/// A number read exactly: num / den reduced (den > 0); `percent` when it was
/// written with a percent sign (the value is then the number before it).
struct exact_number {
  __int128 num = 0;
  __int128 den = 1;
  bool percent = false;
};

/// `text` (normalised) as an exact number; nullopt where it is not one or
/// does not fit 128 bits.
std::optional<exact_number> parse_exact_number(std::string_view text);

/// Whether a response's answer and a ground truth mean the same (see the note).
bool answers_equivalent(std::string_view response_answer, std::string_view ground_truth);

/// The final answer of a ground truth: its "#### x" or \boxed{x} when it has
/// one, else itself.
std::string ground_truth_answer(std::string_view ground_truth);

/// One rule of rl.reward.rules.
struct rule_config {
  rule_kind kind = rule_kind::math;
  /// How the answer is extracted (exact, positional, math, regex).
  answer_extract extract = answer_extract::none;
  /// format: the regex the whole response must match.
  std::string pattern;
  /// overlong: the length at which the penalty is whole; 0 = the job's
  /// rl.generation.max_tokens.
  int64_t max_length = 0;
  /// overlong: the soft zone's length before max_length (DAPO's L_cache).
  int64_t buffer = 0;
  /// overlong: the penalty at max_length (a score of −penalty).
  double penalty = 1.0;
  double weight = 1.0;
};
template <class V>
void visit(V& v, rule_config& c) {
  v.choice("kind", c.kind, "exact | positional | math | regex | format | overlong");
  v.choice("extract", c.extract,
           "How the answer is taken from the response: none (all of it), strict (\"#### x\"), "
           "flexible (the last number), boxed (the last \\boxed{})");
  v.field("pattern", c.pattern, "format: the regex (Python syntax) the whole response must match");
  v.field("max_length", c.max_length, "overlong: full penalty at this many tokens; 0 = max_tokens");
  v.field("buffer", c.buffer, "overlong: tokens before max_length where the penalty grows");
  v.field("penalty", c.penalty, "overlong: the penalty at max_length");
  v.field("weight", c.weight, "This rule's weight in the sum");
}

/// A violation of a rule's settings: the key's path and what is wrong.
struct rule_violation {
  std::string path;
  std::string message;
};

/// Violations of one rule at `path` ("rl.reward.rules[0]"), given the
/// job's max_tokens.
std::vector<rule_violation> rule_violations(const rule_config& c, const std::string& path,
                                            int64_t max_tokens);

/// One response to score: its text (cut at EOS), its token count (without
/// the EOS) and the row's ground truth.
struct scored_response {
  std::string_view text;
  int64_t tokens = 0;
  std::string_view answer;
};

/// Compiled rules with their weights.
class rule_set {
public:
  /// Compiles `rules` (validated: rule_violations); `max_tokens` fills
  /// overlong's default length.
  static expected<rule_set> make(const std::vector<rule_config>& rules, int64_t max_tokens);
  /// Σ weight · score.
  expected<double> score(const scored_response& r) const;
  /// Whether the response's answer is right (see the note).
  expected<bool> correct(const scored_response& r) const;
  /// Whether the response matches every format rule; nullopt without one.
  std::optional<bool> formatted(const scored_response& r) const;

private:
  struct compiled_rule {
    rule_config config;
    std::optional<models::regex> format;
  };
  expected<double> score_one(const compiled_rule& rule, const scored_response& r) const;
  std::vector<compiled_rule> rules_;
};

} // namespace troupe::actors::rl
