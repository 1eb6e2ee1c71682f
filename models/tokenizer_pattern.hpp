#pragma once
// Patterns of tokenizer.json components and how a split treats their matches
// (internal to the tokenizer sources).
//
// NOTE [tokenizer patterns]: Hugging Face tokenizers compiles every Split /
// Replace pattern with Oniguruma (default syntax, UTF-8): leftmost-first
// backtracking alternation, lookahead, \p{..} classes, (?i:..). troupe links
// the same engine, so any pattern behaves as in the reference; the three
// regexes of the common byte-level families (GPT-2, Llama 3, Qwen2) run on
// hand-written scanners instead (tokenizer_split.hpp), which a test checks
// against Oniguruma on random text. A pattern cuts a string into pieces that
// cover it, each flagged as a match or not (the reference's find_matches,
// empty matches included); a split behaviour then decides which pieces
// become splits.

#include "models/tokenizer_json.hpp"
#include "models/tokenizer_split.hpp"

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::models::tok {

/// A piece [begin, end) of a string and whether the pattern matched it.
struct cut {
  size_t begin = 0;
  size_t end = 0;
  bool is_match = false;
};

/// A compiled Split / Replace pattern. Copies share the compiled regex; safe
/// to use from several threads.
class pattern {
public:
  /// Matches `text` literally (an empty literal matches nothing).
  static pattern literal(std::string text);
  /// Compiles `regex` (a known family regex runs on its scanner); a bad
  /// regex is a parse failure at `where`.
  static pattern regex(const std::string& regex, const json_at& where);
  /// Compiles `regex` for Oniguruma, never a scanner (tests compare both).
  static pattern oniguruma(const std::string& regex, const json_at& where);
  /// {"String": s} or {"Regex": r}.
  static pattern from_json(const json_at& p);

  /// The pieces of `text` (covering it in order; one non-match piece for an
  /// empty text).
  std::vector<cut> find_matches(std::string_view text) const;

private:
  struct compiled;
  enum class kind { literal, regex, scanner } kind_ = kind::literal;
  std::string literal_;
  split_pattern scanner_{};
  std::shared_ptr<const compiled> regex_;
};

/// Pieces of `text` where every code point satisfying `pred` is a match of
/// its own and the runs between are non-matches.
std::vector<cut> char_matches(std::string_view text, const std::function<bool(char32_t)>& pred);

/// How a split treats the matches of its pattern.
enum class split_behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

/// Reads "Removed" / "Isolated" / ... at `where`.
split_behavior behavior_from_json(const json_at& where);

/// The byte ranges [begin, end) that `behavior` keeps of `cuts` (after
/// flipping the match flags when `invert`), empty ones left out.
std::vector<std::pair<size_t, size_t>> apply_behavior(std::vector<cut> cuts,
                                                      split_behavior behavior, bool invert);

} // namespace troupe::models::tok
