#pragma once
// Pre-tokenizer splits of byte-level BPE tokenizers. HF tokenizers split text
// with a regex using \p{L} / \p{N}, which std::regex cannot express; each
// known pattern is implemented here as a scanner over code points that
// reproduces the regex's leftmost-first, backtracking semantics.

#include <cstddef>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe::models {

/// The split regexes this build implements.
enum class split_pattern {
  /// GPT-2 (ByteLevel use_regex=true):
  /// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  gpt2,
  /// Llama 3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
  ///          ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  llama3,
  /// Qwen2: as Llama 3 with \p{N} (one digit per piece) instead of \p{N}{1,3}.
  qwen2,
};

/// The regex source text of a pattern, exactly as tokenizer.json stores it.
std::string_view split_pattern_regex(split_pattern p);

/// The pattern whose regex is `regex`, or nullopt for an unknown regex.
std::optional<split_pattern> recognise_split_pattern(std::string_view regex);

/// Byte ranges [begin, end) of the pieces of `text`: the matches of the
/// pattern and, in between, any unmatched text (HF behaviour "Isolated").
/// The ranges cover `text` in order. Ill-formed UTF-8 bytes count as symbols.
std::vector<std::pair<size_t, size_t>> split_text(std::string_view text, split_pattern p);

} // namespace troupe::models
