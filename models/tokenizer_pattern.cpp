#include "models/tokenizer_pattern.hpp"

#include "models/regex.hpp"
#include "models/tokenizer_unicode.hpp"

#include <algorithm>

namespace troupe::models::tok {

struct pattern::compiled {
  models::regex re;
};

namespace {

// Pieces covering `text` from its match ranges (the reference's find_matches).
std::vector<cut> cover(std::string_view text, const std::vector<std::pair<size_t, size_t>>& ms) {
  std::vector<cut> out;
  if (text.empty())
    return {cut{0, 0, false}};
  size_t start = 0;
  for (auto [b, e] : ms) {
    if (start != b)
      out.push_back({start, b, false});
    out.push_back({b, e, true});
    start = e;
  }
  if (start != text.size())
    out.push_back({start, text.size(), false});
  return out;
}

} // namespace

pattern pattern::literal(std::string text) {
  pattern p;
  p.kind_ = kind::literal;
  p.literal_ = std::move(text);
  return p;
}

pattern pattern::regex(const std::string& regex, const json_at& where) {
  if (auto known = recognise_split_pattern(regex)) {
    pattern p;
    p.kind_ = kind::scanner;
    p.scanner_ = *known;
    return p;
  }
  return oniguruma(regex, where);
}

pattern pattern::oniguruma(const std::string& regex, const json_at& where) {
  auto re = models::regex::compile(regex, {});
  if (!re)
    where.fail(context_of(re.error()));
  pattern p;
  p.kind_ = kind::regex;
  p.regex_ = std::make_shared<const compiled>(compiled{std::move(*re)});
  return p;
}

pattern pattern::from_json(const json_at& p) {
  p.object();
  if (auto s = p.get("String", true))
    return literal(s->string());
  if (auto r = p.get("Regex", true))
    return regex(r->string(), *r);
  p.fail("expected {\"String\": ...} or {\"Regex\": ...}");
}

std::vector<cut> pattern::find_matches(std::string_view text) const {
  switch (kind_) {
  case kind::scanner: {
    // The scanners' patterns match every code point, so their pieces are
    // exactly the matches.
    std::vector<std::pair<size_t, size_t>> ms;
    for (auto [b, e] : split_text(text, scanner_))
      ms.emplace_back(b, e);
    return cover(text, ms);
  }
  case kind::regex:
    return cover(text, regex_->re.find_all(text));
  case kind::literal:
    break;
  }
  if (literal_.empty())
    return {cut{0, text.size(), false}};
  std::vector<std::pair<size_t, size_t>> ms;
  for (size_t pos = text.find(literal_); pos != std::string_view::npos;
       pos = text.find(literal_, pos + literal_.size()))
    ms.emplace_back(pos, pos + literal_.size());
  return cover(text, ms);
}

std::vector<cut> char_matches(std::string_view text, const std::function<bool(char32_t)>& pred) {
  if (text.empty())
    return {cut{0, 0, false}};
  std::vector<cut> out;
  size_t last = 0;
  for (size_t i = 0; i < text.size();) {
    auto u = unicode::decode_one(text, i);
    if (u.valid && pred(u.cp)) {
      if (last < i)
        out.push_back({last, i, false});
      out.push_back({i, i + u.length, true});
      last = i + u.length;
    }
    i += u.length;
  }
  if (last < text.size())
    out.push_back({last, text.size(), false});
  return out;
}

split_behavior behavior_from_json(const json_at& where) {
  auto s = where.string();
  if (s == "Removed")
    return split_behavior::removed;
  if (s == "Isolated")
    return split_behavior::isolated;
  if (s == "MergedWithPrevious")
    return split_behavior::merged_with_previous;
  if (s == "MergedWithNext")
    return split_behavior::merged_with_next;
  if (s == "Contiguous")
    return split_behavior::contiguous;
  where.fail("unknown split behavior '" + s +
                 "' (Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous)",
             errc::unsupported);
}

// The reference's NormalizedString::split: each behaviour folds the pieces
// into the ones it keeps (`remove` marks pieces dropped by Removed).
std::vector<std::pair<size_t, size_t>> apply_behavior(std::vector<cut> cuts,
                                                      split_behavior behavior, bool invert) {
  if (invert)
    for (auto& c : cuts)
      c.is_match = !c.is_match;
  struct kept {
    size_t begin, end;
    bool remove;
  };
  std::vector<kept> acc;
  acc.reserve(cuts.size());
  bool previous_match = false;
  switch (behavior) {
  case split_behavior::isolated:
    for (const auto& c : cuts)
      acc.push_back({c.begin, c.end, false});
    break;
  case split_behavior::removed:
    for (const auto& c : cuts)
      acc.push_back({c.begin, c.end, c.is_match});
    break;
  case split_behavior::contiguous:
    for (const auto& c : cuts) {
      if (c.is_match == previous_match && !acc.empty())
        acc.back().end = c.end;
      else
        acc.push_back({c.begin, c.end, false});
      previous_match = c.is_match;
    }
    break;
  case split_behavior::merged_with_previous:
    for (const auto& c : cuts) {
      if (c.is_match && !previous_match && !acc.empty())
        acc.back().end = c.end;
      else
        acc.push_back({c.begin, c.end, false});
      previous_match = c.is_match;
    }
    break;
  case split_behavior::merged_with_next:
    for (auto it = cuts.rbegin(); it != cuts.rend(); ++it) {
      if (it->is_match && !previous_match && !acc.empty())
        acc.back().begin = it->begin;
      else
        acc.push_back({it->begin, it->end, false});
      previous_match = it->is_match;
    }
    std::reverse(acc.begin(), acc.end());
    break;
  }
  std::vector<std::pair<size_t, size_t>> out;
  out.reserve(acc.size());
  for (const auto& k : acc)
    if (!k.remove && k.end > k.begin)
      out.emplace_back(k.begin, k.end);
  return out;
}

} // namespace troupe::models::tok
