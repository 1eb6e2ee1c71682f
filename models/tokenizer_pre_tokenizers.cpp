// Pre-tokenizers of tokenizer.json (NOTE [tokenizer pipeline]).

#include "models/tokenizer_pattern.hpp"
#include "models/tokenizer_pipeline.hpp"
#include "models/tokenizer_unicode.hpp"

#include <functional>

namespace troupe::models::tok {

const std::array<std::string, 256>& byte_level_chars() {
  // GPT-2's bytes_to_unicode: printable Latin-1 bytes ('!'..'~', '¡'..'¬',
  // '®'..'ÿ') stand for themselves; every other byte b gets 256 + n, n
  // counting those bytes in increasing order.
  static const auto table = [] {
    std::array<std::string, 256> out;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      unicode::append_utf8(out[b], printable ? static_cast<char32_t>(b) : next++);
    }
    return out;
  }();
  return table;
}

int byte_level_byte(char32_t cp) {
  static const auto inverse = [] {
    std::array<int16_t, 324> t{};
    t.fill(-1);
    const auto& chars = byte_level_chars();
    for (int b = 0; b < 256; ++b)
      t[unicode::decode_one(chars[b], 0).cp] = static_cast<int16_t>(b);
    return t;
  }();
  return cp < inverse.size() ? inverse[cp] : -1;
}

void materialise(split& s) {
  if (!s.byte_level)
    return;
  const auto& chars = byte_level_chars();
  std::string out;
  out.reserve(s.text.size() * 2);
  for (unsigned char b : s.text)
    out += chars[b];
  s.text = std::move(out);
  s.byte_level = false;
}

bool reference_word_char(char32_t cp) {
  return unicode::is_word_char(cp) || unicode::general_category(cp) == unicode::category::Nl ||
         cp == 0x200C || cp == 0x200D ||
         (cp >= 0x24B6 && cp <= 0x24E9); // circled letters are alphabetic
}

namespace {

// Replaces every split by the pieces `cut_one` makes of it; a piece keeps
// at_start when it begins where its split did.
template <class F>
void resplit(std::vector<split>& splits, F&& cut_one) {
  std::vector<split> out;
  out.reserve(splits.size());
  for (auto& s : splits) {
    materialise(s);
    for (auto [b, e] : cut_one(s))
      out.push_back(split{s.text.substr(b, e - b), false, s.at_start && b == 0});
  }
  splits = std::move(out);
}

using ranges = std::vector<std::pair<size_t, size_t>>;

class byte_level final : public pre_tokenizer {
public:
  byte_level(bool add_prefix_space, bool use_regex, const json_at& where)
      : add_prefix_space_(add_prefix_space) {
    if (use_regex)
      regex_ = pattern::regex(std::string{split_pattern_regex(split_pattern::gpt2)}, where);
  }
  void apply(std::vector<split>& splits) const override {
    std::vector<split> out;
    out.reserve(splits.size());
    for (auto& s : splits) {
      materialise(s);
      if (add_prefix_space_ && (s.text.empty() || s.text.front() != ' '))
        s.text.insert(0, " ");
      if (!regex_) {
        out.push_back(split{std::move(s.text), true, s.at_start});
        continue;
      }
      for (auto [b, e] :
           apply_behavior(regex_->find_matches(s.text), split_behavior::isolated, false))
        out.push_back(split{s.text.substr(b, e - b), true, s.at_start && b == 0});
    }
    splits = std::move(out);
  }

private:
  bool add_prefix_space_;
  std::optional<pattern> regex_;
};

class pattern_split final : public pre_tokenizer {
public:
  pattern_split(pattern p, split_behavior b, bool invert)
      : pattern_(std::move(p)), behavior_(b), invert_(invert) {}
  void apply(std::vector<split>& splits) const override {
    resplit(splits, [&](const split& s) {
      return apply_behavior(pattern_.find_matches(s.text), behavior_, invert_);
    });
  }

private:
  pattern pattern_;
  split_behavior behavior_;
  bool invert_;
};

// Splits on code points satisfying a predicate (Digits, Punctuation,
// WhitespaceSplit, CharDelimiterSplit).
class char_split final : public pre_tokenizer {
public:
  char_split(std::function<bool(char32_t)> pred, split_behavior b)
      : pred_(std::move(pred)), behavior_(b) {}
  void apply(std::vector<split>& splits) const override {
    resplit(splits, [&](const split& s) {
      return apply_behavior(char_matches(s.text, pred_), behavior_, false);
    });
  }

private:
  std::function<bool(char32_t)> pred_;
  split_behavior behavior_;
};

// Metaspace: spaces become the replacement character, which is prepended
// per the scheme and, with `split`, starts each word.
class metaspace final : public pre_tokenizer {
public:
  enum class scheme { always, first, never };
  metaspace(std::string replacement, scheme s, bool split)
      : replacement_(std::move(replacement)), scheme_(s), split_(split) {
    replacement_cp_ = unicode::decode_one(replacement_, 0).cp;
  }
  void apply(std::vector<split>& splits) const override {
    resplit(splits, [&](split& s) {
      std::string text;
      text.reserve(s.text.size());
      for (char c : s.text) {
        if (c == ' ')
          text += replacement_;
        else
          text += c;
      }
      bool starts = text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && (scheme_ == scheme::always || (scheme_ == scheme::first && s.at_start)))
        text.insert(0, replacement_);
      s.text = std::move(text);
      if (!split_)
        return ranges{{0, s.text.size()}};
      return apply_behavior(char_matches(s.text, [&](char32_t c) { return c == replacement_cp_; }),
                            split_behavior::merged_with_next, false);
    });
  }

private:
  std::string replacement_;
  char32_t replacement_cp_ = 0;
  scheme scheme_;
  bool split_;
};

// Whitespace: the runs of \w+ and of [^\w\s]+ (everything else removed).
class whitespace final : public pre_tokenizer {
public:
  void apply(std::vector<split>& splits) const override {
    resplit(splits, [](const split& s) {
      ranges out;
      int run_kind = -1; // 0: word chars, 1: other non-space
      size_t run_begin = 0;
      for (size_t i = 0; i < s.text.size();) {
        auto u = unicode::decode_one(s.text, i);
        int kind = unicode::is_whitespace(u.cp) ? -1 : reference_word_char(u.cp) ? 0 : 1;
        if (kind != run_kind) {
          if (run_kind >= 0)
            out.emplace_back(run_begin, i);
          run_kind = kind;
          run_begin = i;
        }
        i += u.length;
      }
      if (run_kind >= 0)
        out.emplace_back(run_begin, s.text.size());
      return out;
    });
  }
};

bool bert_punctuation(char32_t cp) {
  return (cp < 0x80 && cp > 0x20 && cp != 0x7F && !(cp >= '0' && cp <= '9') &&
          !((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')) ||
         unicode::is_punctuation(cp);
}

std::unique_ptr<pre_tokenizer> metaspace_from_json(const json_at& j) {
  auto replacement = j.text("replacement", "\u2581");
  if (unicode::decode_utf8(replacement).size() != 1)
    j.get("replacement")->fail("expected one character, got '" + replacement + "'");
  auto scheme_text = j.text("prepend_scheme", "always");
  metaspace::scheme s = metaspace::scheme::always;
  if (scheme_text == "first")
    s = metaspace::scheme::first;
  else if (scheme_text == "never")
    s = metaspace::scheme::never;
  else if (scheme_text != "always")
    j.get("prepend_scheme")->fail("expected always, first or never, got '" + scheme_text + "'");
  if (!j.flag("add_prefix_space", true) && s != metaspace::scheme::never)
    j.get("add_prefix_space")->fail("false needs prepend_scheme 'never'");
  return std::make_unique<metaspace>(replacement, s, j.flag("split", true));
}

} // namespace

std::unique_ptr<pre_tokenizer> pre_tokenizer_from_json(const json_at& j) {
  if (j.value.is_null())
    return nullptr;
  auto type = j.type();
  if (type == "ByteLevel")
    return std::make_unique<byte_level>(j.flag("add_prefix_space", true), j.flag("use_regex", true),
                                        j);
  if (type == "Split")
    return std::make_unique<pattern_split>(pattern::from_json(*j.get("pattern")),
                                           behavior_from_json(*j.get("behavior")),
                                           j.flag("invert", false));
  if (type == "Metaspace")
    return metaspace_from_json(j);
  if (type == "Whitespace")
    return std::make_unique<whitespace>();
  if (type == "WhitespaceSplit")
    return std::make_unique<char_split>(unicode::is_whitespace, split_behavior::removed);
  if (type == "Digits") {
    auto individual = j.flag("individual_digits", false);
    return std::make_unique<char_split>(
        unicode::is_number, individual ? split_behavior::isolated : split_behavior::contiguous);
  }
  if (type == "Punctuation") {
    auto b = j.get("behavior", true);
    return std::make_unique<char_split>(bert_punctuation, b && !b->value.is_null()
                                                              ? behavior_from_json(*b)
                                                              : split_behavior::isolated);
  }
  if (type == "CharDelimiterSplit") {
    auto d = j.get("delimiter")->string();
    auto units = unicode::decode_utf8(d);
    if (units.size() != 1 || !units[0].valid)
      j.get("delimiter")->fail("expected one character, got '" + d + "'");
    char32_t cp = units[0].cp;
    return std::make_unique<char_split>([cp](char32_t c) { return c == cp; },
                                        split_behavior::removed);
  }
  using sequence = sequence_of<pre_tokenizer, std::vector<split>&>;
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<pre_tokenizer>> steps;
    steps.push_back(std::make_unique<char_split>(unicode::is_whitespace, split_behavior::removed));
    steps.push_back(std::make_unique<char_split>(bert_punctuation, split_behavior::isolated));
    return std::make_unique<sequence>(std::move(steps));
  }
  if (type == "Sequence")
    return std::make_unique<sequence>(
        parse_list<pre_tokenizer>(j, "pretokenizers", pre_tokenizer_from_json));
  j.unsupported_type("pre-tokenizer",
                     {"ByteLevel", "Split", "Metaspace", "Whitespace", "WhitespaceSplit", "Digits",
                      "Punctuation", "CharDelimiterSplit", "BertPreTokenizer", "Sequence"});
}

} // namespace troupe::models::tok
