// Normalizers of tokenizer.json (NOTE [tokenizer pipeline]).

#include "models/tokenizer_pattern.hpp"
#include "models/tokenizer_pipeline.hpp"
#include "models/tokenizer_unicode.hpp"

namespace troupe::models::tok {

namespace {

class unicode_form final : public normalizer {
public:
  explicit unicode_form(unicode::normal_form f) : form_(f) {}
  void apply(std::string& text) const override { text = unicode::normalize(text, form_); }

private:
  unicode::normal_form form_;
};

class lowercase final : public normalizer {
public:
  void apply(std::string& text) const override { text = unicode::lowercase(text); }
};

// Strip: white space (Unicode White_Space) off either end.
class strip final : public normalizer {
public:
  strip(bool left, bool right) : left_(left), right_(right) {}
  void apply(std::string& text) const override {
    auto units = unicode::decode_utf8(text);
    size_t b = 0, e = units.size();
    if (left_)
      while (b < e && units[b].valid && unicode::is_whitespace(units[b].cp))
        ++b;
    if (right_)
      while (e > b && units[e - 1].valid && unicode::is_whitespace(units[e - 1].cp))
        --e;
    size_t from = b < units.size() ? units[b].offset : text.size();
    size_t to = e < units.size() ? units[e].offset : text.size();
    text = text.substr(from, to - from);
  }

private:
  bool left_, right_;
};

// StripAccents: drops combining marks (Mn, Mc, Me) without decomposing.
class strip_accents final : public normalizer {
public:
  void apply(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (const auto& u : unicode::decode_utf8(text))
      if (!u.valid || !unicode::is_mark(u.cp))
        out.append(text, u.offset, u.length);
    text = std::move(out);
  }
};

// Prepend: `prefix` before a non-empty piece.
class prepend final : public normalizer {
public:
  explicit prepend(std::string p) : prefix_(std::move(p)) {}
  void apply(std::string& text) const override {
    if (!text.empty())
      text.insert(0, prefix_);
  }

private:
  std::string prefix_;
};

// Replace: every match of the pattern by `content`.
class replace final : public normalizer {
public:
  replace(pattern p, std::string content) : pattern_(std::move(p)), content_(std::move(content)) {}
  void apply(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (const auto& c : pattern_.find_matches(text)) {
      if (c.is_match)
        out += content_;
      else
        out.append(text, c.begin, c.end - c.begin);
    }
    text = std::move(out);
  }

private:
  pattern pattern_;
  std::string content_;
};

bool is_chinese_char(char32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

// BertNormalizer: clean control characters, space out CJK ideographs, strip
// accents (after NFD), lowercase.
class bert final : public normalizer {
public:
  bert(bool clean, bool chinese, bool accents, bool lower)
      : clean_(clean), chinese_(chinese), accents_(accents), lower_(lower) {}
  void apply(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (const auto& u : unicode::decode_utf8(text)) {
      char32_t cp = u.cp;
      if (clean_) {
        if (cp == 0 || cp == 0xFFFD || (is_other(cp) && cp != '\t' && cp != '\n' && cp != '\r'))
          continue;
        if (unicode::is_whitespace(cp))
          cp = ' ';
      }
      if (chinese_ && is_chinese_char(cp)) {
        out += ' ';
        unicode::append_utf8(out, cp);
        out += ' ';
        continue;
      }
      unicode::append_utf8(out, cp);
    }
    if (accents_) {
      out = unicode::normalize(out, unicode::normal_form::nfd);
      std::string kept;
      for (const auto& u : unicode::decode_utf8(out))
        if (unicode::general_category(u.cp) != unicode::category::Mn)
          kept.append(out, u.offset, u.length);
      out = std::move(kept);
    }
    if (lower_)
      out = unicode::lowercase(out);
    text = std::move(out);
  }

private:
  static bool is_other(char32_t cp) {
    auto c = unicode::general_category(cp);
    return c == unicode::category::Cc || c == unicode::category::Cf || c == unicode::category::Cn ||
           c == unicode::category::Co || c == unicode::category::Cs;
  }
  bool clean_, chinese_, accents_, lower_;
};

// Nmt: drops some control characters and maps others to a space.
class nmt final : public normalizer {
public:
  void apply(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (const auto& u : unicode::decode_utf8(text)) {
      char32_t cp = u.cp;
      if ((cp >= 0x1 && cp <= 0x8) || cp == 0xB || (cp >= 0xE && cp <= 0x1F) || cp == 0x7F ||
          cp == 0x8F || cp == 0x9F)
        continue;
      if (cp == 0x9 || cp == 0xA || cp == 0xC || cp == 0xD || cp == 0x1680 ||
          (cp >= 0x200B && cp <= 0x200F) || cp == 0x2028 || cp == 0x2029 || cp == 0x2581 ||
          cp == 0xFEFF || cp == 0xFFFD)
        cp = ' ';
      unicode::append_utf8(out, cp);
    }
    text = std::move(out);
  }
};

// The ByteLevel normalizer: each byte becomes its ByteLevel character.
class byte_level final : public normalizer {
public:
  void apply(std::string& text) const override {
    split s{std::move(text), true, false};
    materialise(s);
    text = std::move(s.text);
  }
};

} // namespace

std::unique_ptr<normalizer> normalizer_from_json(const json_at& j) {
  if (j.value.is_null())
    return nullptr;
  auto type = j.type();
  using unicode::normal_form;
  if (type == "NFC")
    return std::make_unique<unicode_form>(normal_form::nfc);
  if (type == "NFD")
    return std::make_unique<unicode_form>(normal_form::nfd);
  if (type == "NFKC")
    return std::make_unique<unicode_form>(normal_form::nfkc);
  if (type == "NFKD")
    return std::make_unique<unicode_form>(normal_form::nfkd);
  if (type == "Lowercase")
    return std::make_unique<lowercase>();
  if (type == "Strip")
    return std::make_unique<strip>(j.flag("strip_left", true), j.flag("strip_right", true));
  if (type == "StripAccents")
    return std::make_unique<strip_accents>();
  if (type == "Prepend")
    return std::make_unique<prepend>(j.get("prepend")->string());
  if (type == "Replace")
    return std::make_unique<replace>(pattern::from_json(*j.get("pattern")),
                                     j.get("content")->string());
  if (type == "BertNormalizer") {
    bool lower = j.flag("lowercase", true);
    return std::make_unique<bert>(j.flag("clean_text", true), j.flag("handle_chinese_chars", true),
                                  j.flag("strip_accents", lower), lower);
  }
  if (type == "Nmt")
    return std::make_unique<nmt>();
  if (type == "ByteLevel")
    return std::make_unique<byte_level>();
  if (type == "Sequence")
    return std::make_unique<sequence_of<normalizer, std::string&>>(
        parse_list<normalizer>(j, "normalizers", normalizer_from_json));
  j.unsupported_type("normalizer",
                     {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Strip", "StripAccents", "Prepend",
                      "Replace", "BertNormalizer", "Nmt", "ByteLevel", "Sequence"});
}

} // namespace troupe::models::tok
