// Added tokens of tokenizer.json (NOTE [tokenizer pipeline]).

#include "models/tokenizer_pipeline.hpp"
#include "models/tokenizer_unicode.hpp"

namespace troupe::models::tok {

void added_vocabulary::trie::add(std::string_view key, int32_t token) {
  if (terminal.empty())
    terminal.push_back(-1);
  int32_t node = 0;
  for (unsigned char b : key) {
    auto k = (static_cast<uint64_t>(node) << 8) | b;
    auto it = next.find(k);
    if (it == next.end()) {
      terminal.push_back(-1);
      it = next.emplace(k, static_cast<int32_t>(terminal.size() - 1)).first;
    }
    node = it->second;
  }
  terminal[node] = token;
  first[static_cast<unsigned char>(key[0])] = true;
}

void added_vocabulary::parse(const json_at& list, const token_model& model,
                             const normalizer* norm) {
  const int64_t base = model.size();
  for (size_t i = 0; i < list.array().size(); ++i) {
    auto e = list.at(i);
    token t;
    t.content = e.get("content")->string();
    if (t.content.empty())
      continue; // the reference skips these
    t.special = e.flag("special", false);
    t.lstrip = e.flag("lstrip", false);
    t.rstrip = e.flag("rstrip", false);
    t.single_word = e.flag("single_word", false);
    t.normalized = e.flag("normalized", !t.special);
    if (auto id = e.get("id", true))
      id->integer(0, std::numeric_limits<int32_t>::max()); // checked, not trusted (below)
    t.normalized_content = t.content;
    if (t.normalized && norm != nullptr)
      norm->apply(t.normalized_content);
    // The reference's ids: an earlier added token's, else the model's, else
    // the next free one (the JSON "id" is not consulted).
    if (auto known = by_content_.find(t.content); known != by_content_.end()) {
      t.id = tokens_[known->second].id;
      tokens_[known->second] = std::move(t);
      continue;
    }
    if (auto id = model.token_to_id(t.content))
      t.id = *id;
    else
      t.id = std::max(base, max_id_ + 1);
    max_id_ = std::max(max_id_, t.id);
    by_content_.emplace(t.content, tokens_.size());
    by_id_.emplace(t.id, tokens_.size());
    tokens_.push_back(std::move(t));
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const auto& t = tokens_[i];
    if (!t.normalized)
      raw_.add(t.content, static_cast<int32_t>(i));
    else if (!t.normalized_content.empty())
      normalized_.add(t.normalized_content, static_cast<int32_t>(i));
  }
}

namespace {

bool word_before(std::string_view text, size_t pos) {
  if (pos == 0)
    return false;
  size_t p = pos - 1;
  while (p > 0 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80)
    --p;
  auto u = unicode::decode_one(text, p);
  return u.valid && reference_word_char(u.cp);
}

bool word_after(std::string_view text, size_t pos) {
  if (pos >= text.size())
    return false;
  auto u = unicode::decode_one(text, pos);
  return u.valid && reference_word_char(u.cp);
}

// Start of the white-space run that ends at `pos`.
size_t space_run_before(std::string_view text, size_t pos) {
  while (pos > 0) {
    size_t p = pos - 1;
    while (p > 0 && (static_cast<unsigned char>(text[p]) & 0xC0) == 0x80)
      --p;
    auto u = unicode::decode_one(text, p);
    if (!u.valid || !unicode::is_whitespace(u.cp))
      break;
    pos = p;
  }
  return pos;
}

// End of the white-space run that starts at `pos`.
size_t space_run_after(std::string_view text, size_t pos) {
  while (pos < text.size()) {
    auto u = unicode::decode_one(text, pos);
    if (!u.valid || !unicode::is_whitespace(u.cp))
      break;
    pos += u.length;
  }
  return pos;
}

} // namespace

std::pair<int32_t, size_t> added_vocabulary::trie::longest_at(std::string_view text,
                                                              size_t i) const {
  int32_t node = 0, best = -1;
  size_t best_end = i;
  for (size_t j = i; j < text.size(); ++j) {
    auto it = next.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[j]));
    if (it == next.end())
      break;
    node = it->second;
    if (terminal[node] >= 0) {
      best = terminal[node];
      best_end = j + 1;
    }
  }
  return {best, best_end};
}

std::tuple<int32_t, size_t, size_t> added_vocabulary::trie::leftmost_longest(std::string_view text,
                                                                             size_t from) const {
  for (size_t begin = from; begin < text.size(); ++begin) {
    if (!first[static_cast<unsigned char>(text[begin])])
      continue;
    if (auto [token, end] = longest_at(text, begin); token >= 0)
      return {token, begin, end};
  }
  return {-1, text.size(), text.size()};
}

std::vector<added_vocabulary::piece> added_vocabulary::cut(std::string_view text,
                                                           bool normalized_pass) const {
  const trie& t = normalized_pass ? normalized_ : raw_;
  std::vector<piece> out;
  size_t emitted = 0; // end of the last piece
  size_t pos = 0;     // where the next search starts
  while (!t.terminal.empty() && pos < text.size()) {
    auto [index, begin, end] = t.leftmost_longest(text, pos);
    if (index < 0)
      break;
    const token& tok = tokens_[index];
    pos = end; // the next search resumes after this match, kept or not
    if (tok.single_word && (word_before(text, begin) || word_after(text, end)))
      continue;
    if (tok.lstrip)
      begin = space_run_before(text, begin);
    if (tok.rstrip)
      end = space_run_after(text, end);
    begin = std::max(begin, emitted); // white space a previous token took stays there
    if (emitted < begin)
      out.push_back({emitted, begin, nullptr});
    out.push_back({begin, end, &tok});
    emitted = end;
  }
  if (emitted < text.size())
    out.push_back({emitted, text.size(), nullptr});
  return out;
}

const added_vocabulary::token* added_vocabulary::by_id(int64_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

const added_vocabulary::token* added_vocabulary::by_content(std::string_view content) const {
  auto it = by_content_.find(std::string{content});
  return it == by_content_.end() ? nullptr : &tokens_[it->second];
}

bool added_vocabulary::is_special_content(std::string_view text) const {
  const auto* t = by_content(text);
  return t != nullptr && t->special;
}

} // namespace troupe::models::tok
