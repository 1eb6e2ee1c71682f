// Decoders and post-processors of tokenizer.json (NOTE [tokenizer pipeline]).

#include "models/tokenizer_pattern.hpp"
#include "models/tokenizer_pipeline.hpp"
#include "models/tokenizer_unicode.hpp"

#include <limits>

namespace troupe::models::tok {

namespace {

// ByteLevel: a token whose characters are all ByteLevel characters becomes
// their bytes, any other token its own UTF-8; the bytes of all tokens are
// joined and decoded with one U+FFFD per maximal ill-formed subsequence.
class byte_level_decoder final : public decoder {
public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      size_t start = bytes.size();
      bool mapped = true;
      for (size_t i = 0; i < t.size() && mapped;) {
        auto u = unicode::decode_one(t, i);
        int b = u.valid ? byte_level_byte(u.cp) : -1;
        if (b < 0)
          mapped = false;
        else
          bytes += static_cast<char>(b);
        i += u.length;
      }
      if (!mapped) {
        bytes.resize(start);
        bytes += t;
      }
    }
    tokens.assign(1, unicode::to_valid_utf8(bytes));
  }
};

// ByteFallback: runs of <0xXX> tokens become their bytes when these form
// valid UTF-8, else one U+FFFD per byte of the run.
class byte_fallback final : public decoder {
public:
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_tokens = 0;
    auto flush = [&] {
      if (run_tokens == 0)
        return;
      if (unicode::is_valid_utf8(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run_tokens; ++i)
          out.emplace_back("\uFFFD");
      }
      run.clear();
      run_tokens = 0;
    };
    for (auto& t : tokens) {
      if (auto b = byte_of(t)) {
        run += static_cast<char>(*b);
        ++run_tokens;
        continue;
      }
      flush();
      out.push_back(std::move(t));
    }
    flush();
    tokens = std::move(out);
  }

private:
  static std::optional<unsigned char> byte_of(const std::string& t) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>')
      return std::nullopt;
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9')
        return c - '0';
      if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
      if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
      return -1;
    };
    int hi = hex(t[3]), lo = hex(t[4]);
    if (hi < 0 || lo < 0)
      return std::nullopt;
    return static_cast<unsigned char>(hi * 16 + lo);
  }
};

class fuse final : public decoder {
public:
  void apply(std::vector<std::string>& tokens) const override {
    std::string all;
    for (const auto& t : tokens)
      all += t;
    tokens.assign(1, std::move(all));
  }
};

// Strip: up to `start` leading and `stop` trailing `content` characters of
// every token.
class strip_decoder final : public decoder {
public:
  strip_decoder(char32_t content, int64_t start, int64_t stop)
      : content_(content), start_(start), stop_(stop) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      auto units = unicode::decode_utf8(t);
      size_t b = 0, e = units.size();
      for (int64_t k = 0; k < start_ && b < e && units[b].cp == content_ && units[b].valid; ++k)
        ++b;
      for (int64_t k = 0; k < stop_ && e > b && units[e - 1].cp == content_ && units[e - 1].valid;
           ++k)
        --e;
      size_t from = b < units.size() ? units[b].offset : t.size();
      size_t to = e < units.size() ? units[e].offset : t.size();
      t = t.substr(from, to - from);
    }
  }

private:
  char32_t content_;
  int64_t start_, stop_;
};

class replace_decoder final : public decoder {
public:
  replace_decoder(pattern p, std::string content)
      : pattern_(std::move(p)), content_(std::move(content)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::string out;
      for (const auto& c : pattern_.find_matches(t))
        out += c.is_match ? content_ : t.substr(c.begin, c.end - c.begin);
      t = std::move(out);
    }
  }

private:
  pattern pattern_;
  std::string content_;
};

// Metaspace: the replacement character becomes a space, except that the
// first token loses every one when the scheme prepends.
class metaspace final : public decoder {
public:
  metaspace(std::string replacement, bool prepends)
      : replacement_(std::move(replacement)), prepends_(prepends) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const auto& t = tokens[i];
      for (size_t p = 0; p < t.size();) {
        if (t.compare(p, replacement_.size(), replacement_) == 0) {
          if (!(i == 0 && prepends_))
            out += ' ';
          p += replacement_.size();
        } else {
          out += t[p++];
        }
      }
      tokens[i] = std::move(out);
    }
  }

private:
  std::string replacement_;
  bool prepends_;
};

void cleanup(std::string& t, bool with_do_not) {
  static const std::pair<const char*, const char*> rules[] = {
      {" .", "."},   {" ?", "?"},     {" !", "!"},     {" ,", ","},
      {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},   {" do not", " don't"},
      {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
  };
  for (auto [from, to] : rules) {
    std::string_view f{from};
    if (!with_do_not && f == " do not")
      continue;
    std::string out;
    for (size_t p = 0; p < t.size();) {
      if (t.compare(p, f.size(), f) == 0) {
        out += to;
        p += f.size();
      } else {
        out += t[p++];
      }
    }
    t = std::move(out);
  }
}

// WordPiece: "##" pieces join their word, others get a space before them.
class word_piece_decoder final : public decoder {
public:
  word_piece_decoder(std::string prefix, bool clean)
      : prefix_(std::move(prefix)), cleanup_(clean) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      auto& t = tokens[i];
      if (i != 0) {
        if (t.compare(0, prefix_.size(), prefix_) == 0)
          t = t.substr(prefix_.size());
        else
          t = " " + t;
      }
      if (cleanup_)
        cleanup(t, true);
    }
  }

private:
  std::string prefix_;
  bool cleanup_;
};

// BPEDecoder: the end-of-word suffix becomes a space (nothing on the last).
class bpe_suffix final : public decoder {
public:
  explicit bpe_suffix(std::string suffix) : suffix_(std::move(suffix)) {}
  void apply(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      auto& t = tokens[i];
      std::string out;
      for (size_t p = 0; p < t.size();) {
        if (!suffix_.empty() && t.compare(p, suffix_.size(), suffix_) == 0) {
          if (i + 1 != tokens.size())
            out += ' ';
          p += suffix_.size();
        } else {
          out += t[p++];
        }
      }
      t = std::move(out);
    }
  }

private:
  std::string suffix_;
};

// CTC: repeated tokens collapse, the pad token goes, the word delimiter
// becomes a space (with cleanup).
class ctc final : public decoder {
public:
  ctc(std::string pad, std::string delimiter, bool clean)
      : pad_(std::move(pad)), delimiter_(std::move(delimiter)), cleanup_(clean) {}
  void apply(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0 && tokens[i] == tokens[i - 1])
        continue;
      std::string t = tokens[i];
      if (t == pad_)
        t.clear();
      if (cleanup_) {
        cleanup(t, true);
        if (t == delimiter_)
          t.assign(1, ' ');
      }
      if (!t.empty())
        out.push_back(std::move(t));
    }
    tokens = std::move(out);
  }

private:
  std::string pad_, delimiter_;
  bool cleanup_;
};

char32_t one_char(const json_at& j, const char* key, const std::string& fallback) {
  auto s = j.text(key, fallback);
  auto units = unicode::decode_utf8(s);
  if (units.size() != 1 || !units[0].valid)
    j.get(key)->fail("expected one character, got '" + s + "'");
  return units[0].cp;
}

} // namespace

std::unique_ptr<decoder> decoder_from_json(const json_at& j) {
  if (j.value.is_null())
    return nullptr;
  auto type = j.type();
  if (type == "ByteLevel")
    return std::make_unique<byte_level_decoder>();
  if (type == "ByteFallback")
    return std::make_unique<byte_fallback>();
  if (type == "Fuse")
    return std::make_unique<fuse>();
  if (type == "Strip")
    return std::make_unique<strip_decoder>(one_char(j, "content", " "),
                                           j.get("start")->integer(0, 1 << 20),
                                           j.get("stop")->integer(0, 1 << 20));
  if (type == "Replace")
    return std::make_unique<replace_decoder>(pattern::from_json(*j.get("pattern")),
                                             j.get("content")->string());
  if (type == "Metaspace") {
    auto replacement = j.text("replacement", "\u2581");
    one_char(j, "replacement", "\u2581");
    auto scheme = j.text("prepend_scheme", "always");
    bool prepends = scheme != "never" && j.flag("add_prefix_space", true);
    return std::make_unique<metaspace>(replacement, prepends);
  }
  if (type == "WordPiece")
    return std::make_unique<word_piece_decoder>(j.text("prefix", "##"), j.flag("cleanup", true));
  if (type == "BPEDecoder")
    return std::make_unique<bpe_suffix>(j.text("suffix", "</w>"));
  if (type == "CTC")
    return std::make_unique<ctc>(j.text("pad_token", "<pad>"), j.text("word_delimiter_token", "|"),
                                 j.flag("cleanup", true));
  if (type == "Sequence")
    return std::make_unique<sequence_of<decoder, std::vector<std::string>&>>(
        parse_list<decoder>(j, "decoders", decoder_from_json));
  j.unsupported_type("decoder", {"ByteLevel", "ByteFallback", "Fuse", "Strip", "Replace",
                                 "Metaspace", "WordPiece", "BPEDecoder", "CTC", "Sequence"});
}

// ---- post-processors ----------------------------------------------------------------

namespace {

// Ids before and after the text's ids, added when asked (TemplateProcessing
// for a single text, Bert and Roberta processing, tokenizer_config.json).
class affix final : public post_processor {
public:
  affix(std::vector<int64_t> prefix, std::vector<int64_t> suffix)
      : prefix_(std::move(prefix)), suffix_(std::move(suffix)) {}
  void apply(std::vector<int64_t>& ids, bool add_special_tokens) const override {
    if (!add_special_tokens)
      return;
    ids.insert(ids.begin(), prefix_.begin(), prefix_.end());
    ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  }

private:
  std::vector<int64_t> prefix_, suffix_;
};

class no_op final : public post_processor {
public:
  void apply(std::vector<int64_t>&, bool) const override {}
};

// TemplateProcessing's "single" template: its special-token pieces before
// and after the one sequence piece ($A).
std::unique_ptr<post_processor> template_from_json(const json_at& j) {
  auto single = *j.get("single");
  auto specials = *j.get("special_tokens");
  std::vector<int64_t> prefix, suffix;
  bool seen_sequence = false;
  for (size_t i = 0; i < single.array().size(); ++i) {
    auto piece = single.at(i);
    if (auto seq = piece.get("Sequence", true)) {
      if (seen_sequence)
        seq->fail("a single-text template holds one sequence");
      seen_sequence = true;
      continue;
    }
    auto special = piece.get("SpecialToken", true);
    if (!special)
      piece.fail("expected {\"Sequence\": ...} or {\"SpecialToken\": ...}");
    auto name = special->get("id")->string();
    auto entry = specials.get(name.c_str(), true);
    if (!entry)
      special->get("id")->fail("'" + name + "' is not in special_tokens");
    auto ids = *entry->get("ids");
    auto& out = seen_sequence ? suffix : prefix;
    for (size_t k = 0; k < ids.array().size(); ++k)
      out.push_back(ids.at(k).integer(0, std::numeric_limits<int32_t>::max()));
  }
  if (!seen_sequence)
    single.fail("the template has no sequence ($A)");
  return std::make_unique<affix>(std::move(prefix), std::move(suffix));
}

// The id of a ["token", id] pair (Bert / Roberta processing).
int64_t pair_id(const json_at& j) {
  if (!j.value.is_array() || j.value.size() != 2 || !j.value[0].is_string())
    j.fail("expected [\"token\", id]");
  return j.at(1).integer(0, std::numeric_limits<int32_t>::max());
}

} // namespace

std::unique_ptr<post_processor> affix_post_processor(std::vector<int64_t> prefix,
                                                     std::vector<int64_t> suffix) {
  return std::make_unique<affix>(std::move(prefix), std::move(suffix));
}

std::unique_ptr<post_processor> post_processor_from_json(const json_at& j) {
  if (j.value.is_null())
    return nullptr;
  auto type = j.type();
  if (type == "TemplateProcessing")
    return template_from_json(j);
  if (type == "ByteLevel")
    return std::make_unique<no_op>(); // it trims offsets only
  if (type == "BertProcessing" || type == "RobertaProcessing")
    return std::make_unique<affix>(std::vector<int64_t>{pair_id(*j.get("cls"))},
                                   std::vector<int64_t>{pair_id(*j.get("sep"))});
  if (type == "Sequence")
    return std::make_unique<sequence_of<post_processor, std::vector<int64_t>&, bool>>(
        parse_list<post_processor>(j, "processors", post_processor_from_json));
  j.unsupported_type("post-processor", {"TemplateProcessing", "ByteLevel", "BertProcessing",
                                        "RobertaProcessing", "Sequence"});
}

} // namespace troupe::models::tok
