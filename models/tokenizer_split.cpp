#include "models/tokenizer_split.hpp"

#include "models/tokenizer_unicode.hpp"

#include <cstdint>

namespace troupe::models {

namespace {

constexpr std::string_view gpt2_regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view llama3_regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view qwen2_regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

enum cls : uint8_t { letter, number, space, other };

struct sym {
  char32_t cp;  // code point, or 0xFFFFFFFF for an invalid byte
  uint8_t kind; // cls
};

class scanner {
public:
  scanner(const std::vector<sym>& s, split_pattern p) : s_(s), n_(s.size()), p_(p) {}

  // Length in symbols of the match at `i`, or 0 when no alternative matches.
  size_t match_at(size_t i) const {
    if (auto k = contraction(i))
      return k;
    return p_ == split_pattern::gpt2 ? gpt2_rest(i) : llama_rest(i);
  }

private:
  bool is(size_t i, cls c) const { return i < n_ && s_[i].kind == c; }
  bool cp_is(size_t i, char32_t cp) const { return i < n_ && s_[i].cp == cp; }
  bool crlf(size_t i) const { return cp_is(i, '\r') || cp_is(i, '\n'); }

  size_t run(size_t i, cls c) const {
    size_t j = i;
    while (j < n_ && s_[j].kind == c)
      ++j;
    return j - i;
  }

  // Case-insensitive when `fold`: ASCII case, and U+017F (long s) folds to s.
  bool letter_at(size_t i, char lower, bool fold) const {
    if (i >= n_)
      return false;
    char32_t c = s_[i].cp;
    if (c == static_cast<char32_t>(lower))
      return true;
    if (!fold)
      return false;
    if (c == static_cast<char32_t>(lower - 'a' + 'A'))
      return true;
    return lower == 's' && c == 0x17F;
  }

  // 's|'t|'re|'ve|'m|'ll|'d (case-insensitive for the Llama 3 family).
  size_t contraction(size_t i) const {
    if (!cp_is(i, '\''))
      return 0;
    bool fold = p_ != split_pattern::gpt2;
    for (char c : {'s', 't'})
      if (letter_at(i + 1, c, fold))
        return 2;
    if (letter_at(i + 1, 'r', fold) && letter_at(i + 2, 'e', fold))
      return 3;
    if (letter_at(i + 1, 'v', fold) && letter_at(i + 2, 'e', fold))
      return 3;
    if (letter_at(i + 1, 'm', fold))
      return 2;
    if (letter_at(i + 1, 'l', fold) && letter_at(i + 2, 'l', fold))
      return 3;
    if (letter_at(i + 1, 'd', fold))
      return 2;
    return 0;
  }

  // " ?X+" for a class X: an optional U+0020, then a run of X.
  size_t space_then_run(size_t i, cls c) const {
    if (cp_is(i, ' ') && is(i + 1, c))
      return 1 + run(i + 1, c);
    return is(i, c) ? run(i, c) : 0;
  }

  // \s+(?!\S) then \s+: a white-space run, minus its last symbol when a
  // non-space follows and the run is longer than one.
  size_t trailing_space(size_t i) const {
    size_t k = run(i, space);
    if (k == 0)
      return 0;
    if (i + k == n_ || k == 1)
      return k;
    return k - 1;
  }

  size_t gpt2_rest(size_t i) const {
    if (auto k = space_then_run(i, letter))
      return k;
    if (auto k = space_then_run(i, number))
      return k;
    if (auto k = space_then_run(i, other))
      return k;
    return trailing_space(i);
  }

  size_t llama_rest(size_t i) const {
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (i < n_ && !crlf(i) && !is(i, letter) && !is(i, number) && is(i + 1, letter))
      return 1 + run(i + 1, letter);
    if (is(i, letter))
      return run(i, letter);
    // \p{N}{1,3} (Llama 3) or \p{N} (Qwen2)
    if (is(i, number)) {
      size_t k = run(i, number);
      size_t max = p_ == split_pattern::llama3 ? 3 : 1;
      return k < max ? k : max;
    }
    // " ?[^\s\p{L}\p{N}]+[\r\n]*"
    if (auto k = space_then_run(i, other)) {
      size_t j = i + k;
      while (crlf(j))
        ++j;
      return j - i;
    }
    // \s*[\r\n]+: the white-space run up to and including its last \r or \n.
    size_t k = run(i, space);
    for (size_t j = k; j > 0; --j)
      if (crlf(i + j - 1))
        return j;
    return trailing_space(i);
  }

  const std::vector<sym>& s_;
  size_t n_;
  split_pattern p_;
};

} // namespace

std::string_view split_pattern_regex(split_pattern p) {
  switch (p) {
  case split_pattern::gpt2:
    return gpt2_regex;
  case split_pattern::llama3:
    return llama3_regex;
  case split_pattern::qwen2:
    return qwen2_regex;
  }
  return {};
}

std::optional<split_pattern> recognise_split_pattern(std::string_view regex) {
  for (auto p : {split_pattern::gpt2, split_pattern::llama3, split_pattern::qwen2})
    if (regex == split_pattern_regex(p))
      return p;
  return std::nullopt;
}

std::vector<std::pair<size_t, size_t>> split_text(std::string_view text, split_pattern p) {
  auto units = unicode::decode_utf8(text);
  std::vector<sym> syms;
  syms.reserve(units.size());
  for (const auto& u : units) {
    if (!u.valid) {
      syms.push_back({0xFFFFFFFF, other});
      continue;
    }
    uint8_t kind = unicode::is_letter(u.cp)       ? letter
                   : unicode::is_number(u.cp)     ? number
                   : unicode::is_whitespace(u.cp) ? space
                                                  : other;
    syms.push_back({u.cp, kind});
  }
  scanner sc{syms, p};
  std::vector<std::pair<size_t, size_t>> out;
  auto byte_at = [&](size_t i) { return i < units.size() ? size_t{units[i].offset} : text.size(); };
  size_t gap_begin = 0; // start (in symbols) of unmatched text
  size_t i = 0;
  while (i < syms.size()) {
    size_t k = sc.match_at(i);
    if (k == 0) {
      ++i;
      continue;
    }
    if (gap_begin < i)
      out.emplace_back(byte_at(gap_begin), byte_at(i));
    out.emplace_back(byte_at(i), byte_at(i + k));
    i += k;
    gap_begin = i;
  }
  if (gap_begin < syms.size())
    out.emplace_back(byte_at(gap_begin), text.size());
  return out;
}

} // namespace troupe::models
