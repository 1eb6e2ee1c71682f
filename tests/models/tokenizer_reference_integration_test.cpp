// troupe's tokenizer against the reference implementation (Hugging Face
// tokenizers' own Node binding), on the tokenizer files of five real model
// families and on variants that exercise every supported component. The
// reference outputs are produced here, at test time, by
// tests/reference/reference.js.
#include "models/tokenizer.hpp"
#include "models/tokenizer_unicode.hpp"
#include "tests/models/tokenizer_reference.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>

using namespace troupe;
using namespace troupe::models;
using nlohmann::json;

namespace {

using ids_t = std::vector<int64_t>;

std::string show(const std::string& text) {
  auto s = json(unicode::to_valid_utf8(text)).dump();
  return s.size() > 120 ? s.substr(0, 117) + "..." : s;
}

std::string first_difference(const ids_t& a, const ids_t& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i])
    ++i;
  std::ostringstream o;
  o << "first difference at " << i << " (troupe " << a.size() << " ids, reference " << b.size()
    << "): troupe ";
  for (size_t k = i; k < std::min(a.size(), i + 6); ++k)
    o << a[k] << ' ';
  o << "| reference ";
  for (size_t k = i; k < std::min(b.size(), i + 6); ++k)
    o << b[k] << ' ';
  return o.str();
}

// Compares troupe's encode / decode of `texts` with the reference's, for the
// tokenizer.json at `path`; returns the number of texts compared.
size_t expect_equal_to_reference(const std::string& path, const std::vector<std::string>& texts,
                                 const std::string& label) {
  auto tok = hf_tokenizer::from_file(path);
  EXPECT_TRUE(tok) << label << ": " << (tok ? "" : describe(tok.error()));
  if (!tok)
    return 0;
  json request{{"tokenizer", path}, {"texts", json::array()}, {"decode", json::array()}};
  std::vector<ids_t> ours;
  for (const auto& t : texts) {
    request["texts"].push_back(runtime::base64(t));
    ours.push_back(tok->encode(t));
    // Cut sequences: a token off either end (characters split between
    // tokens decode lossily).
    const auto& ids = ours.back();
    if (ids.size() > 2) {
      request["decode"].push_back(ids_t(ids.begin() + 1, ids.end()));
      request["decode"].push_back(ids_t(ids.begin(), ids.end() - 1));
    }
  }
  std::string error;
  auto ref = test::run_reference(request, error);
  EXPECT_TRUE(error.empty()) << label << ": " << error;
  if (!error.empty())
    return 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const auto& r = ref["encode"][i];
    auto want = r["ids"].get<ids_t>();
    EXPECT_EQ(ours[i], want) << label << " text " << i << " " << show(texts[i]) << ": "
                             << first_difference(ours[i], want);
    auto special = tok->encode(texts[i], {true});
    auto want_special = r["ids_special"].get<ids_t>();
    EXPECT_EQ(special, want_special)
        << label << " text " << i
        << " with special tokens: " << first_difference(special, want_special);
    auto decoded = tok->decode(want);
    if (!decoded) {
      ADD_FAILURE() << label << ": " << describe(decoded.error());
      continue;
    }
    EXPECT_EQ(*decoded, r["decoded"].get<std::string>()) << label << " decode of text " << i;
    auto skipped = tok->decode(want_special, {true});
    if (!skipped) {
      ADD_FAILURE() << label << ": " << describe(skipped.error());
      continue;
    }
    EXPECT_EQ(*skipped, r["decoded_skip"].get<std::string>())
        << label << " decode (skip special) of text " << i;
  }
  const auto& cuts = request["decode"];
  for (size_t i = 0; i < cuts.size(); ++i) {
    auto text = tok->decode(cuts[i].get<ids_t>());
    if (!text) {
      ADD_FAILURE() << label << ": " << describe(text.error());
      continue;
    }
    EXPECT_EQ(*text, ref["decode"][i]["text"].get<std::string>()) << label << " cut decode " << i;
  }
  return texts.size();
}

json read_json(const std::string& path) {
  std::ifstream f(path);
  return json::parse(f);
}

class RealTokenizer : public testing::TestWithParam<const char*> {
protected:
  void SetUp() override {
    if (auto why = test::reference_missing(); !why.empty())
      FAIL() << why;
  }
};

TEST_P(RealTokenizer, IdsAndDecodingEqualTheReferenceOnTrickyText) {
  auto dir = test::real_tokenizer_dir(GetParam());
  auto n = expect_equal_to_reference(dir + "/tokenizer.json", test::tokenizer_corpus(), GetParam());
  EXPECT_GT(n, 50u);
}

INSTANTIATE_TEST_SUITE_P(Families, RealTokenizer,
                         testing::Values("llama2", "llama3", "qwen3", "gemma3", "deepseek_v3"));

// ---- every component, through variants of real files ----------------------------

json metaspace(const char* scheme, bool split) {
  return {{"type", "Metaspace"},
          {"replacement", "\u2581"},
          {"prepend_scheme", scheme},
          {"split", split}};
}

json byte_level_pre(bool prefix, bool regex) {
  return {{"type", "ByteLevel"},
          {"add_prefix_space", prefix},
          {"trim_offsets", true},
          {"use_regex", regex}};
}

json split_pre(json pattern, const char* behavior, bool invert) {
  return {{"type", "Split"},
          {"pattern", std::move(pattern)},
          {"behavior", behavior},
          {"invert", invert}};
}

json added(const std::string& content, bool special, bool lstrip, bool rstrip, bool single_word,
           bool normalized) {
  return {{"id", 0},
          {"content", content},
          {"special", special},
          {"lstrip", lstrip},
          {"rstrip", rstrip},
          {"single_word", single_word},
          {"normalized", normalized}};
}

struct variant {
  const char* name;
  const char* base;
  std::function<void(json&)> edit;
  std::vector<std::string> extra_texts;
};

std::vector<variant> variants() {
  const json prepend = {{"type", "Prepend"}, {"prepend", "\u2581"}};
  const json space_to_meta = {
      {"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
  return {
      {"NFKC, Lowercase, Strip",
       "llama2",
       [=](json& j) {
         j["normalizer"] = {{"type", "Sequence"},
                            {"normalizers",
                             {{{"type", "NFKC"}},
                              {{"type", "Lowercase"}},
                              {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                              prepend,
                              space_to_meta}}};
       },
       {}},
      {"NFD, StripAccents, NFKD",
       "llama2",
       [=](json& j) {
         j["normalizer"] = {{"type", "Sequence"},
                            {"normalizers",
                             {{{"type", "NFD"}},
                              {{"type", "StripAccents"}},
                              {{"type", "NFKD"}},
                              prepend,
                              space_to_meta}}};
       },
       {}},
      {"Replace by regex, Nmt",
       "llama2",
       [=](json& j) {
         j["normalizer"] = {
             {"type", "Sequence"},
             {"normalizers",
              {{{"type", "Nmt"}},
               {{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", " "}},
               prepend,
               space_to_meta}}};
       },
       {}},
      {"Metaspace first, split",
       "llama2",
       [](json& j) {
         j["normalizer"] = nullptr;
         j["pre_tokenizer"] = metaspace("first", true);
         j["decoder"] = metaspace("first", true);
       },
       {}},
      {"Metaspace always, no split",
       "llama2",
       [](json& j) {
         j["normalizer"] = nullptr;
         j["pre_tokenizer"] = metaspace("always", false);
         j["decoder"] = {
             {"type", "Sequence"},
             {"decoders",
              {metaspace("always", false), {{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}};
       },
       {}},
      {"Digits, Punctuation, Metaspace never",
       "llama2",
       [](json& j) {
         j["normalizer"] = nullptr;
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers",
                                {{{"type", "Digits"}, {"individual_digits", true}},
                                 {{"type", "Punctuation"}, {"behavior", "Isolated"}},
                                 metaspace("never", true)}}};
         j["decoder"] = metaspace("never", true);
       },
       {}},
      {"Digits contiguous, CharDelimiterSplit, WhitespaceSplit",
       "llama3",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Sequence"},
                               {"pretokenizers",
                                {{{"type", "Digits"}, {"individual_digits", false}},
                                 {{"type", "CharDelimiterSplit"}, {"delimiter", ","}},
                                 {{"type", "WhitespaceSplit"}},
                                 byte_level_pre(true, false)}}};
       },
       {}},
      {"Whitespace, ByteLevel with a prefix space",
       "llama3",
       [](json& j) {
         j["pre_tokenizer"] = {
             {"type", "Sequence"},
             {"pretokenizers", {{{"type", "Whitespace"}}, byte_level_pre(true, false)}}};
       },
       {}},
      {"ByteLevel with the GPT-2 regex",
       "llama3",
       [](json& j) { j["pre_tokenizer"] = byte_level_pre(false, true); },
       {}},
      {"Split behaviours",
       "qwen3",
       [](json& j) {
         j["pre_tokenizer"] = {
             {"type", "Sequence"},
             {"pretokenizers",
              {split_pre({{"Regex", "\\s+"}}, "MergedWithPrevious", false),
               split_pre({{"Regex", "[0-9]"}}, "Contiguous", false),
               split_pre({{"String", ","}}, "MergedWithNext", false),
               split_pre({{"Regex", "\\p{Lu}"}}, "Isolated", true),
               split_pre({{"Regex", "x+"}}, "Removed", false), byte_level_pre(false, false)}}};
       },
       {}},
      {"the Llama 3 regex, spelled so that Oniguruma runs it",
       "llama3",
       [](json& j) {
         auto& re = j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"];
         re = "(?:" + re.get<std::string>() + ")";
       },
       {}},
      {"added tokens: lstrip, rstrip, single_word, normalized",
       "llama3",
       [](json& j) {
         j["normalizer"] = {{"type", "Lowercase"}};
         for (auto t : {added("[MASK]", true, true, true, false, false),
                        added("<word>", false, false, false, true, false),
                        added("hello", false, false, false, false, true),
                        added("Grüße", false, false, false, false, true),
                        added("the", false, false, true, false, false),
                        added("[SEP]", true, true, false, false, false),
                        added("[MASKED]", false, false, false, false, false)})
           j["added_tokens"].push_back(t);
       },
       {"[MASK]  a  [MASK] b[MASK]c  [MASK]", "a<word> <word> word<word> (<word>)<word>",
        "HELLO hello HeLLo hellothere", "GRÜSSE grüße GRÜßE", "the  then  the\n\tthe",
        "x [SEP] [SEP][SEP]   [MASKED] [MASK]ED"}},
  };
}

TEST(TokenizerComponents, EveryVariantEqualsTheReference) {
  if (auto why = test::reference_missing(); !why.empty())
    FAIL() << why;
  test::temp_dir dir;
  auto corpus = test::tokenizer_corpus();
  int i = 0;
  for (const auto& v : variants()) {
    auto j = read_json(test::real_tokenizer_dir(v.base) + "/tokenizer.json");
    v.edit(j);
    auto path = dir.write("variant" + std::to_string(i++) + ".json", j.dump());
    auto texts = corpus;
    texts.insert(texts.end(), v.extra_texts.begin(), v.extra_texts.end());
    expect_equal_to_reference(path, texts, v.name);
  }
}

// A BERT-style WordPiece tokenizer written here (the real files are BPE):
// BertNormalizer, BertPreTokenizer, WordPiece, BertProcessing, WordPiece
// decoder; and a WordLevel one with decoders of their own.
TEST(TokenizerComponents, WordPieceAndWordLevelEqualTheReference) {
  if (auto why = test::reference_missing(); !why.empty())
    FAIL() << why;
  json vocab = {{"[PAD]", 0}, {"[UNK]", 1}, {"[CLS]", 2}, {"[SEP]", 3}};
  auto add = [&](const std::string& t) {
    if (!vocab.contains(t))
      vocab[t] = static_cast<int64_t>(vocab.size());
  };
  for (char c = 'a'; c <= 'z'; ++c) {
    add(std::string(1, c));
    add("##" + std::string(1, c));
  }
  for (char c = '0'; c <= '9'; ++c)
    add(std::string(1, c));
  for (const char* p : {".", ",", "!", "?", "'", "\"", "(", ")", ":", ";", "-", "_", "<",  ">", "/",
                        "#", "{", "}", "[", "]", "=",  "&", "*", "+", "$", "%", "@", "中", "文"})
    add(p);
  for (const char* w : {"hello", "world", "the", "quick", "brown", "fox", "##ing", "##s", "un",
                        "##able", "word", "##1", "##2", "##3", "cafe", "naive", "grusse"})
    add(w);
  json word_piece = {{"version", "1.0"},
                     {"truncation", nullptr},
                     {"padding", nullptr},
                     {"added_tokens",
                      {added("[PAD]", true, false, false, false, false),
                       added("[UNK]", true, false, false, false, false),
                       added("[CLS]", true, false, false, false, false),
                       added("[SEP]", true, false, false, false, false)}},
                     {"normalizer",
                      {{"type", "BertNormalizer"},
                       {"clean_text", true},
                       {"handle_chinese_chars", true},
                       {"strip_accents", nullptr},
                       {"lowercase", true}}},
                     {"pre_tokenizer", {{"type", "BertPreTokenizer"}}},
                     {"post_processor",
                      {{"type", "BertProcessing"}, {"sep", {"[SEP]", 3}}, {"cls", {"[CLS]", 2}}}},
                     {"decoder", {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}},
                     {"model",
                      {{"type", "WordPiece"},
                       {"unk_token", "[UNK]"},
                       {"continuing_subword_prefix", "##"},
                       {"max_input_chars_per_word", 100},
                       {"vocab", vocab}}}};
  json word_level = word_piece;
  word_level["normalizer"] = {{"type", "Lowercase"}};
  word_level["pre_tokenizer"] = {{"type", "Whitespace"}};
  word_level["post_processor"] = {{"type", "RobertaProcessing"},
                                  {"sep", {"[SEP]", 3}},
                                  {"cls", {"[CLS]", 2}},
                                  {"trim_offsets", true},
                                  {"add_prefix_space", false}};
  word_level["decoder"] = {
      {"type", "Sequence"},
      {"decoders",
       {{{"type", "Replace"}, {"pattern", {{"String", "o"}}}, {"content", "0"}},
        {{"type", "Strip"}, {"content", "h"}, {"start", 1}, {"stop", 1}},
        {{"type", "BPEDecoder"}, {"suffix", "d"}}}}};
  word_level["model"] = {{"type", "WordLevel"}, {"vocab", vocab}, {"unk_token", "[UNK]"}};
  test::temp_dir dir;
  auto texts = test::tokenizer_corpus();
  texts.insert(texts.end(), {"Hello world hellos unable! Quick brownie.", "café naïve Grüße 中文字",
                             std::string(120, 'a') + " and word123"});
  expect_equal_to_reference(dir.write("wordpiece.json", word_piece.dump()), texts, "WordPiece");
  expect_equal_to_reference(dir.write("wordlevel.json", word_level.dump()), texts, "WordLevel");
}

} // namespace
