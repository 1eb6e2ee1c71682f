#pragma once
// Regular expressions over UTF-8 text on Oniguruma, the engine the tokenizer
// patterns use (NOTE [tokenizer patterns]).
//
// Two dialects: `onig` (Oniguruma's default syntax, what tokenizer.json
// patterns are written in) and `python` (Python's `re` syntax, what users of
// RLHF frameworks write their reward patterns in: `^` / `$` anchor at the
// string's ends, `(?s)` / `(?i)` flags). Every search runs under a retry limit,
// so a catastrophically backtracking pattern on a long text ends with "no
// match" in bounded time instead of hanging its caller.

#include "runtime/error.hpp"

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe::models {

class regex {
public:
  enum class dialect { onig, python };
  struct options {
    dialect syntax = dialect::onig;
    /// `.` matches a newline too (Python's re.DOTALL).
    bool dot_all = false;
    /// Anchored at both ends: `matches` is Python's re.fullmatch.
    bool full = false;
  };

  /// Compiles `pattern`; a bad one is a parse_error quoting it and
  /// Oniguruma's reason.
  static expected<regex> compile(const std::string& pattern, options opts);

  /// Whether the pattern matches somewhere in `text` (everywhere with
  /// options::full).
  bool matches(std::string_view text) const;

  /// The matches' byte ranges [begin, end), left to right, each search
  /// starting where the previous match ended; an empty match right at the
  /// end of the previous one is skipped by one character (the Rust onig
  /// crate's find_iter, which Hugging Face tokenizers use).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

private:
  struct compiled;
  std::string pattern_;
  std::shared_ptr<const compiled> re_;
};

} // namespace troupe::models
