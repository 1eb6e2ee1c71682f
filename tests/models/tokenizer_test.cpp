#include "models/tokenizer.hpp"
#include "models/tokenizer_pattern.hpp"
#include "models/tokenizer_split.hpp"
#include "models/tokenizer_unicode.hpp"
#include "runtime/error.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <random>
#include <stdexcept>
#include <thread>

using namespace troupe;
using namespace troupe::models;
using nlohmann::json;

namespace {

using ids = std::vector<int64_t>;

const std::string multilingual =
    "Hello, world! Grüße aus Köln, ÄÖÜ äöü ß. 你好，世界。こんにちは、カタカナ。"
    "مرحبا بالعالم שלום עולם नमस्ते 안녕하세요 Ελληνικά Кириллица "
    "😀👍🏽🇩🇪 "
    "tabs\tand\nnew\r\nlines  and   spaces 12345 ٣٤٥ ½ — \"quotes\" it's WE'LL\n\n";

// GPT-2's byte -> symbol table, written out independently of the library:
// printable Latin-1 bytes stand for themselves, the rest get U+0100 + n.
std::string byte_symbol(int b) {
  static const auto table = [] {
    std::vector<std::string> t(256);
    int next = 256;
    for (int i = 0; i < 256; ++i) {
      bool printable = (i >= 33 && i <= 126) || (i >= 161 && i <= 172) || (i >= 174 && i <= 255);
      int cp = printable ? i : next++;
      std::string s;
      if (cp < 0x80) {
        s += static_cast<char>(cp);
      } else {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
      }
      t[i] = s;
    }
    return t;
  }();
  return table[b];
}

// A small GPT-2-style tokenizer.json: ids 0..255 are the byte symbols (id ==
// byte value; "Ġ" = space = 32), then merged tokens, then <|endoftext|>.
json small_tokenizer_json() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b)
    vocab[byte_symbol(b)] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {
      {"Ġ", "t"},   // 0 -> Ġt    256
      {"h", "e"},   // 1 -> he    257
      {"Ġt", "he"}, // 2 -> Ġthe  258
      {"l", "l"},   // 3 -> ll    259
      {"e", "ll"},  // 4 -> ell   260
      {"H", "ell"}, // 5 -> Hell  261
      {"Ġ", "w"},   // 6 -> Ġw    262
      {"o", "r"},   // 7 -> or    263
      {"Ġw", "or"}, // 8 -> Ġwor  264
      {"1", "2"},   // 9 -> 12    265
      {"'", "s"},   // 10 -> 's   266
  };
  json merge_list = json::array();
  int64_t next = 256;
  for (size_t i = 0; i < merges.size(); ++i) {
    const auto& [a, b] = merges[i];
    vocab[a + b] = next++;
    // Both forms that exist in the wild: "a b" strings and [a, b] pairs.
    if (i % 2 == 0)
      merge_list.push_back(a + " " + b);
    else
      merge_list.push_back(json::array({a, b}));
  }
  vocab["Ġworld"] = 267; // reachable only with ignore_merges
  return json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", json::array({{{"id", 268},
                                     {"content", "<|endoftext|>"},
                                     {"single_word", false},
                                     {"lstrip", false},
                                     {"rstrip", false},
                                     {"normalized", true},
                                     {"special", true}},
                                    {{"id", 269}, {"content", "<tool>"}, {"special", false}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "ByteLevel"},
        {"add_prefix_space", false},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"post_processor",
       {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""},
        {"fuse_unk", false},
        {"vocab", vocab},
        {"merges", merge_list}}},
  };
}

// The same model with the Llama 3 / Qwen2 pre-tokenizer and NFC.
json split_tokenizer_json(split_pattern p, bool nfc) {
  auto j = small_tokenizer_json();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", json::array({{{"type", "Split"},
                                      {"pattern", {{"Regex", std::string{split_pattern_regex(p)}}}},
                                      {"behavior", "Isolated"},
                                      {"invert", false}},
                                     {{"type", "ByteLevel"},
                                      {"add_prefix_space", false},
                                      {"trim_offsets", true},
                                      {"use_regex", false}}})}};
  if (nfc)
    j["normalizer"] = {{"type", "NFC"}};
  return j;
}

hf_tokenizer make(const json& j) {
  auto t = hf_tokenizer::from_json(j.dump(), "tokenizer.json");
  if (!t)
    throw std::runtime_error(describe(t.error())); // gtest reports it as a failure
  return std::move(*t);
}

std::vector<std::string> split(const std::string& text, split_pattern p) {
  std::vector<std::string> out;
  for (auto [b, e] : split_text(text, p))
    out.push_back(text.substr(b, e - b));
  return out;
}

using strings = std::vector<std::string>;

} // namespace

// ---- unicode ---------------------------------------------------------------------

TEST(Unicode, ClassifiesLettersNumbersAndSpaces) {
  for (char32_t cp : {U'A', U'z', U'é', U'ß', U'ж', U'Ω', U'ب', U'א', U'क', U'中', U'あ', U'ア',
                      U'한', U'ǅ', U'ʰ'})
    EXPECT_TRUE(unicode::is_letter(cp)) << static_cast<uint32_t>(cp);
  for (char32_t cp : {U'1', U'!', U' ', U'_', U'\u0301', U'\u093F', U'😀', U'٣', U'€'})
    EXPECT_FALSE(unicode::is_letter(cp)) << static_cast<uint32_t>(cp);
  for (char32_t cp : {U'0', U'9', U'٣', U'३', U'½', U'Ⅻ', U'²', U'𝟙'})
    EXPECT_TRUE(unicode::is_number(cp)) << static_cast<uint32_t>(cp);
  for (char32_t cp : {U'a', U'.', U'中'})
    EXPECT_FALSE(unicode::is_number(cp)) << static_cast<uint32_t>(cp);
  for (char32_t cp : {U' ', U'\t', U'\n', U'\r', U'\v', U'\f', U'\u0085', U'\u00A0', U'\u2003',
                      U'\u3000', U'\u2028'})
    EXPECT_TRUE(unicode::is_whitespace(cp)) << static_cast<uint32_t>(cp);
  for (char32_t cp : {U'a', U'\u200B', U'\u001C'})
    EXPECT_FALSE(unicode::is_whitespace(cp)) << static_cast<uint32_t>(cp);
}

TEST(Unicode, NfcComposesReordersAndPassesInvalidBytes) {
  EXPECT_EQ(unicode::nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(unicode::nfc("e\u0301"), "\u00E9");             // e + acute -> é
  EXPECT_EQ(unicode::nfc("\u212B"), "\u00C5");              // Angstrom sign -> Å
  EXPECT_EQ(unicode::nfc("\u1100\u1161\u11A8"), "\uAC01");  // Hangul jamo -> 각
  EXPECT_EQ(unicode::nfc("d\u0307\u0323"), "\u1E0D\u0307"); // reorder, then compose
  EXPECT_EQ(unicode::nfc("\u0344"), "\u0308\u0301");        // excluded from composition
  EXPECT_EQ(unicode::nfc("Gru\u0308\u00DFe"), "Gr\u00FC\u00DFe");
  EXPECT_EQ(unicode::nfc(std::string("a\xFF\u0301", 4)), std::string("a\xFF\u0301", 4));
}

TEST(Unicode, LossyUtf8MatchesTheStandardSubstitution) {
  EXPECT_EQ(unicode::to_valid_utf8("ok é 中 😀"), "ok é 中 😀");
  EXPECT_EQ(unicode::to_valid_utf8("a\xFF"
                                   "b"),
            "a\uFFFD"
            "b");
  EXPECT_EQ(unicode::to_valid_utf8("\xE2\x82"), "\uFFFD"); // truncated 3-byte
  EXPECT_EQ(unicode::to_valid_utf8("\xF0\x9F\x98"
                                   "a"),
            "\uFFFD"
            "a");                                                          // truncated 4-byte
  EXPECT_EQ(unicode::to_valid_utf8("\xED\xA0\x80"), "\uFFFD\uFFFD\uFFFD"); // surrogate
  EXPECT_EQ(unicode::to_valid_utf8("\xC0\xAF"), "\uFFFD\uFFFD");           // overlong
}

TEST(Unicode, CategoriesOfMarksPunctuationAndSymbols) {
  using unicode::category;
  EXPECT_EQ(unicode::general_category(U'A'), category::Lu);
  EXPECT_EQ(unicode::general_category(U'\u0301'), category::Mn);
  EXPECT_EQ(unicode::general_category(U'\u0378'), category::Cn); // unassigned
  EXPECT_EQ(unicode::general_category(U'\U0001F600'), category::So);
  EXPECT_EQ(unicode::general_category(U'\U000E0001'), category::Cf);
  for (char32_t cp : {U'.', U'!', U'(', U'_', U'«', U'、', U'\u2014'})
    EXPECT_TRUE(unicode::is_punctuation(cp)) << static_cast<uint32_t>(cp);
  for (char32_t cp : {U'+', U'$', U'^', U'€', U'😀', U'©'})
    EXPECT_TRUE(unicode::is_symbol(cp)) << static_cast<uint32_t>(cp);
  for (char32_t cp : {U'\u0301', U'\u093F', U'\u20DD'})
    EXPECT_TRUE(unicode::is_mark(cp)) << static_cast<uint32_t>(cp);
  EXPECT_TRUE(unicode::is_word_char(U'_'));
  EXPECT_TRUE(unicode::is_word_char(U'\u0301'));
  EXPECT_FALSE(unicode::is_word_char(U'-'));
}

TEST(Unicode, TheFourNormalizationFormsAndLowercase) {
  using unicode::normal_form;
  EXPECT_EQ(unicode::normalize("\u00E9", normal_form::nfd), "e\u0301");
  EXPECT_EQ(unicode::normalize("\uFB01", normal_form::nfc), "\uFB01"); // ﬁ: compatibility only
  EXPECT_EQ(unicode::normalize("\uFB01", normal_form::nfkc), "fi");
  EXPECT_EQ(unicode::normalize("\u00BD", normal_form::nfkd), "1\u20442");
  EXPECT_EQ(unicode::normalize("\u1E9B\u0323", normal_form::nfkc), "\u1E69"); // UAX 15's example
  EXPECT_EQ(unicode::normalize("\u1E9B\u0323", normal_form::nfkd), "s\u0323\u0307");
  EXPECT_EQ(unicode::normalize("\uAC01", normal_form::nfd), "\u1100\u1161\u11A8");
  EXPECT_EQ(unicode::normalize("\uFF28\uFF49", normal_form::nfkc), "Hi"); // fullwidth
  EXPECT_EQ(unicode::lowercase("HeLLo ÄÖÜ ΣΑΣ İ"), "hello äöü σασ i\u0307");
}

// ---- patterns and split behaviours ------------------------------------------------

std::vector<std::pair<size_t, size_t>> cut_ranges(const tok::pattern& p, const std::string& text) {
  return tok::apply_behavior(p.find_matches(text), tok::split_behavior::isolated, false);
}

// The three family regexes run on hand-written scanners; Oniguruma itself
// must cut random text made of the characters they care about the same way.
TEST(SplitPattern, ScannersEqualOnigurumaOnRandomText) {
  const std::vector<std::string> alphabet = {
      "a", "Z", "é", "ß", "中", "ſ", "'", "s", "S", "t", "re", "VE", "m", "L", "d", "D", " ",
      "  ", "\t", "\n", "\r", "\u00A0", "\u3000", "1", "٣", "½", "!", ".", "(", "😀", "\u0301",
      "_", "-", "\u2028", "\u200B"};
  json dummy = nullptr;
  tok::json_at where{dummy, "test"};
  std::mt19937 rng(7);
  for (auto family : {split_pattern::gpt2, split_pattern::llama3, split_pattern::qwen2}) {
    std::string re{split_pattern_regex(family)};
    auto fast = tok::pattern::regex(re, where);
    auto onig = tok::pattern::oniguruma(re, where);
    for (int n = 0; n < 3000; ++n) {
      std::string text;
      int len = static_cast<int>(rng() % 12);
      for (int k = 0; k < len; ++k)
        text += alphabet[rng() % alphabet.size()];
      ASSERT_EQ(cut_ranges(fast, text), cut_ranges(onig, text))
          << "family " << static_cast<int>(family) << " on " << json(text).dump();
    }
  }
}

TEST(SplitPattern, BehavioursFollowTheReference) {
  json dummy = nullptr;
  tok::json_at where{dummy, "test"};
  const std::string text = "the-final--countdown";
  auto dash = tok::pattern::literal("-");
  auto pieces = [&](tok::split_behavior b, bool invert) {
    strings out;
    for (auto [s, e] : tok::apply_behavior(dash.find_matches(text), b, invert))
      out.push_back(text.substr(s, e - s));
    return out;
  };
  using B = tok::split_behavior;
  EXPECT_EQ(pieces(B::removed, false), (strings{"the", "final", "countdown"}));
  EXPECT_EQ(pieces(B::isolated, false), (strings{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pieces(B::merged_with_previous, false), (strings{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pieces(B::merged_with_next, false), (strings{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pieces(B::contiguous, false), (strings{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(pieces(B::removed, true), (strings{"-", "-", "-"}));
  auto regex = tok::pattern::oniguruma("\\p{N}{1,3}", where);
  EXPECT_EQ(cut_ranges(regex, "ab12345c"),
            (std::vector<std::pair<size_t, size_t>>{{0, 2}, {2, 5}, {5, 7}, {7, 8}}));
  json bad = "(";
  EXPECT_THROW(tok::pattern::oniguruma("(", tok::json_at{bad, "p"}), tok::json_failure);
}

// ---- split patterns (expected pieces computed with the regexes in Python) ----------

TEST(SplitPattern, RecognisesTheKnownRegexesOnly) {
  for (auto p : {split_pattern::gpt2, split_pattern::llama3, split_pattern::qwen2})
    EXPECT_EQ(recognise_split_pattern(split_pattern_regex(p)), p);
  EXPECT_FALSE(recognise_split_pattern(R"(\w+|\s+)"));
}

TEST(SplitPattern, Gpt2) {
  auto p = split_pattern::gpt2;
  EXPECT_EQ(split("Hello world's 123", p), (strings{"Hello", " world", "'s", " 123"}));
  EXPECT_EQ(split("a  b", p), (strings{"a", " ", " b"}));
  EXPECT_EQ(split("a \n\nb  ", p), (strings{"a", " \n", "\n", "b", "  "}));
  EXPECT_EQ(split("I'LL don't", p), (strings{"I", "'", "LL", " don", "'t"}));
  EXPECT_EQ(split("x=1234+y!!", p), (strings{"x", "=", "1234", "+", "y", "!!"}));
  EXPECT_EQ(split("\t\tword", p), (strings{"\t", "\t", "word"}));
  EXPECT_EQ(split("Grüße 你好!", p), (strings{"Grüße", " 你好", "!"}));
  EXPECT_EQ(split("", p), strings{});
}

TEST(SplitPattern, Llama3AndQwen2) {
  auto l = split_pattern::llama3, q = split_pattern::qwen2;
  EXPECT_EQ(split("Hello world's 1234567", l),
            (strings{"Hello", " world", "'s", " ", "123", "456", "7"}));
  EXPECT_EQ(split("Hello world's 1234567", q),
            (strings{"Hello", " world", "'s", " ", "1", "2", "3", "4", "5", "6", "7"}));
  EXPECT_EQ(split("I'LL DON'T", l), (strings{"I", "'LL", " DON", "'T"}));
  EXPECT_EQ(split("\tword (x)\n\n  y", l), (strings{"\tword", " (", "x", ")\n\n", " ", " y"}));
  EXPECT_EQ(split("a \n \nb", l), (strings{"a", " \n \n", "b"}));
  EXPECT_EQ(split("end  ", l), (strings{"end", "  "}));
  EXPECT_EQ(split("'hello", l), (strings{"'hello"}));
  EXPECT_EQ(split("नमस्ते", l), (strings{"नमस", "्त", "े"}));
}

// ---- byte tokenizer ----------------------------------------------------------------

TEST(ByteTokenizer, RoundTripsMultilingualText) {
  byte_tokenizer t;
  auto enc = t.encode(multilingual);
  EXPECT_EQ(enc.size(), multilingual.size());
  auto dec = t.decode(enc);
  ASSERT_TRUE(dec);
  EXPECT_EQ(*dec, multilingual);
  EXPECT_EQ(t.encode("Aü"), (ids{65, 0xC3, 0xBC}));
}

TEST(ByteTokenizer, SpecialTokensAndErrors) {
  byte_tokenizer t;
  EXPECT_EQ(t.vocab_size(), 259);
  EXPECT_EQ(t.pad_id(), 256);
  EXPECT_EQ(t.bos_id(), 257);
  EXPECT_EQ(t.eos_id(), 258);
  EXPECT_EQ(t.token_to_id("<eos>"), 258);
  EXPECT_TRUE(t.is_special(256));
  EXPECT_FALSE(t.is_special(255));
  EXPECT_EQ(t.encode("<eos>").size(), 5u);
  EXPECT_EQ(*t.decode({257, 104, 105, 258, 256}), "<bos>hi<eos><pad>");
  EXPECT_EQ(*t.decode({257, 104, 105, 258, 256}, {.skip_special_tokens = true}), "hi");
  EXPECT_EQ(*t.decode({0xC3}), "\uFFFD"); // half a character
  auto bad = t.decode({104, 259});
  ASSERT_FALSE(bad);
  EXPECT_EQ(code_of(bad.error()), errc::out_of_range);
  EXPECT_NE(context_of(bad.error()).find("id 259 at position 1"), std::string::npos);
  EXPECT_FALSE(t.decode({-1}));
}

// ---- tokenizer.json pipelines ------------------------------------------------------------------

TEST(HfTokenizer, EncodesWithRankedMerges) {
  auto t = make(small_tokenizer_json());
  EXPECT_EQ(t.vocab_size(), 270);
  // "Hello" -> H e ll o -> H ell o -> Hell o;  " world" -> Ġw o r l d -> Ġw or l d -> Ġwor l d;
  // "'s" -> 's;  " 123" -> Ġ 12 3.
  EXPECT_EQ(t.encode("Hello world's 123"), (ids{261, 111, 264, 108, 100, 266, 32, 265, 51}));
  EXPECT_EQ(t.encode(" the"), (ids{258}));
  EXPECT_EQ(t.encode("hello"), (ids{257, 259, 111}));
  EXPECT_EQ(t.encode("the"), (ids{116, 257}));
  EXPECT_EQ(t.encode("ü"), (ids{0xC3, 0xBC}));
  EXPECT_EQ(t.encode(""), ids{});
  EXPECT_EQ(t.pre_tokenize("Hello world's 123"), (strings{"Hello", "Ġworld", "'s", "Ġ123"}));
  EXPECT_EQ(t.id_to_token(258), "Ġthe");
  EXPECT_EQ(t.id_to_token(32), "Ġ");
  EXPECT_EQ(t.token_to_id("Ġthe"), 258);
  EXPECT_EQ(t.token_to_id("<|endoftext|>"), 268);
  EXPECT_FALSE(t.token_to_id("nope"));
}

TEST(HfTokenizer, AddedTokensAreMatchedWholeFirst) {
  auto t = make(small_tokenizer_json());
  EXPECT_EQ(t.encode("<|endoftext|> the<|endoftext|>"), (ids{268, 258, 268}));
  EXPECT_EQ(t.encode("hello<|endoftext|>"), (ids{257, 259, 111, 268}));
  EXPECT_EQ(t.encode("<|endoftext"), (ids{60, 124, 101, 110, 100, 111, 102, 116, 101, 120, 116}));
  EXPECT_EQ(t.encode("a<tool>b"), (ids{97, 269, 98}));
  EXPECT_TRUE(t.is_special(268));
  EXPECT_FALSE(t.is_special(269));
  EXPECT_EQ(*t.decode({257, 268, 258}), "he<|endoftext|> the");
  EXPECT_EQ(*t.decode({257, 268, 258, 269}, {.skip_special_tokens = true}), "he the<tool>");
}

TEST(HfTokenizer, IgnoreMergesTakesWholeVocabularyWords) {
  auto j = small_tokenizer_json();
  EXPECT_EQ(make(j).encode(" world"), (ids{264, 108, 100}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(make(j).encode(" world"), (ids{267}));
}

TEST(HfTokenizer, SplitPatternFamiliesAndNfc) {
  auto llama = make(split_tokenizer_json(split_pattern::llama3, false));
  EXPECT_EQ(llama.pre_tokenize("Hello world's 1234567"),
            (strings{"Hello", "Ġworld", "'s", "Ġ", "123", "456", "7"}));
  EXPECT_EQ(llama.encode("Hello world's 12"), (ids{261, 111, 264, 108, 100, 266, 32, 265}));
  auto qwen = make(split_tokenizer_json(split_pattern::qwen2, true));
  EXPECT_EQ(qwen.encode(" 12"), (ids{32, 49, 50}));     // one digit per piece: "12" never merges
  EXPECT_EQ(qwen.encode("e\u0301"), (ids{0xC3, 0xA9})); // NFC first: é
  EXPECT_EQ(llama.encode("e\u0301"), (ids{101, 0xCC, 0x81}));
}

TEST(HfTokenizer, RoundTripsMultilingualTextForEveryFamily) {
  std::vector<json> configs = {small_tokenizer_json(),
                               split_tokenizer_json(split_pattern::llama3, false),
                               split_tokenizer_json(split_pattern::qwen2, false)};
  for (const auto& j : configs) {
    auto t = make(j);
    auto enc = t.encode(multilingual);
    auto dec = t.decode(enc);
    ASSERT_TRUE(dec) << describe(dec.error());
    EXPECT_EQ(*dec, multilingual);
    std::string with_special = "<|endoftext|>" + multilingual + "<|endoftext|>";
    EXPECT_EQ(*t.decode(t.encode(with_special)), with_special);
  }
}

TEST(HfTokenizer, DecodeRejectsBadIdsNamingThem) {
  auto t = make(small_tokenizer_json());
  for (int64_t id : {int64_t{-1}, int64_t{270}, int64_t{1} << 40}) {
    auto r = t.decode({72, id});
    ASSERT_FALSE(r) << id;
    EXPECT_EQ(code_of(r.error()), errc::out_of_range);
    EXPECT_NE(
        context_of(r.error()).find("tokenizer.json: id " + std::to_string(id) + " at position 1"),
        std::string::npos)
        << context_of(r.error());
  }
  EXPECT_EQ(*t.decode({0xE4, 0xBD}), "\uFFFD"); // half of 你
}

TEST(HfTokenizer, IsSafeToShareAcrossThreads) {
  auto t = make(split_tokenizer_json(split_pattern::llama3, false));
  auto expected_ids = t.encode(multilingual);
  std::vector<ids> results(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i)
    threads.emplace_back([&, i] {
      for (int k = 0; k < 20; ++k)
        results[i] = t.encode(multilingual);
    });
  for (auto& th : threads)
    th.join();
  for (const auto& r : results)
    EXPECT_EQ(r, expected_ids);
}

struct bad_tokenizer {
  const char* label;
  std::function<void(json&)> edit;
  errc code;
  const char* reason;
};

TEST(HfTokenizer, RejectsMalformedJsonNamingThePath) {
  std::vector<bad_tokenizer> cases = {
      {"merge_not_string", [](json& j) { j["model"]["merges"][1] = 5; }, errc::parse_error,
       "model.merges[1]: expected a string or a pair of strings, got 5"},
      {"merge_three_parts", [](json& j) { j["model"]["merges"][0] = "a b c"; }, errc::parse_error,
       "model.merges[0]: expected two tokens separated by one space"},
      {"merge_unknown_token",
       [](json& j) {
         j["model"]["merges"][2] = json::array({"zz", "a"});
       },
       errc::parse_error, "model.merges[2]: token 'zz' is not in model.vocab"},
      {"merge_result_unknown", [](json& j) { j["model"]["merges"][2] = "a b"; }, errc::parse_error,
       "model.merges[2]: merged token 'ab' is not in model.vocab"},
      {"no_model", [](json& j) { j.erase("model"); }, errc::parse_error, "missing key 'model'"},
      {"no_vocab", [](json& j) { j["model"].erase("vocab"); }, errc::parse_error,
       "model: missing key 'vocab'"},
      {"vocab_id_string", [](json& j) { j["model"]["vocab"]["he"] = "7"; }, errc::parse_error,
       "model.vocab.he: expected an integer in [0, 2147483647], got \"7\""},
      {"vocab_id_negative", [](json& j) { j["model"]["vocab"]["he"] = -3; }, errc::parse_error,
       "model.vocab.he: expected an integer in [0, 2147483647], got -3"},
      {"vocab_duplicate_id", [](json& j) { j["model"]["vocab"]["zzz"] = 5; }, errc::parse_error,
       "model.vocab: id 5 is both"},
      {"sparse_ids", [](json& j) { j["model"]["vocab"]["zzz"] = 1000000000; }, errc::parse_error,
       "id 1000000000 is far beyond"},
      {"model_type", [](json& j) { j["model"]["type"] = "Unigram"; }, errc::unsupported,
       "model.type: model 'Unigram' is not supported (supported: BPE, WordPiece, WordLevel)"},
      {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, errc::unsupported,
       "model.dropout: BPE dropout is not supported"},
      {"unk_not_in_vocab", [](json& j) { j["model"]["unk_token"] = "<unk>"; }, errc::parse_error,
       "model.unk_token: '<unk>' is not in model.vocab"},
      {"added_bad_id", [](json& j) { j["added_tokens"][0]["id"] = "x"; }, errc::parse_error,
       "added_tokens[0].id: expected an integer"},
      {"added_no_content", [](json& j) { j["added_tokens"][1].erase("content"); },
       errc::parse_error, "added_tokens[1]: missing key 'content'"},
      {"added_bad_flag", [](json& j) { j["added_tokens"][1]["special"] = "yes"; },
       errc::parse_error, "added_tokens[1].special: expected a boolean, got string"},
      {"normalizer",
       [](json& j) {
         j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}};
       },
       errc::unsupported, "normalizer.type: normalizer 'Precompiled' is not supported"},
      {"nested_normalizer",
       [](json& j) {
         j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"kind", "x"}}}}};
       },
       errc::parse_error, "normalizer.normalizers[1]: expected an object with a string 'type'"},
      {"pre_tokenizer",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
       },
       errc::unsupported, "pre_tokenizer.type: pre-tokenizer 'UnicodeScripts' is not supported"},
      {"bad_regex",
       [](json& j) {
         j = split_tokenizer_json(split_pattern::llama3, false);
         j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a";
       },
       errc::parse_error, "pre_tokenizer.pretokenizers[0].pattern.Regex: invalid regex '(a'"},
      {"bad_behavior",
       [](json& j) {
         j = split_tokenizer_json(split_pattern::llama3, false);
         j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways";
       },
       errc::unsupported, "pre_tokenizer.pretokenizers[0].behavior: unknown split behavior 'Sideways'"},
      {"decoder",
       [](json& j) {
         j["decoder"] = {{"type", "Mystery"}};
       },
       errc::unsupported, "decoder.type: decoder 'Mystery' is not supported"},
      {"post_processor",
       [](json& j) {
         j["post_processor"] = {{"type", "TemplateProcessing"},
                                {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}}},
                                {"special_tokens", json::object()}};
       },
       errc::parse_error, "post_processor.single[0].SpecialToken.id: '<s>' is not in special_tokens"},
      {"truncation", [](json& j) { j["truncation"] = {{"max_length", 5}}; }, errc::unsupported,
       "truncation: not supported"},
  };
  for (const auto& c : cases) {
    auto j = small_tokenizer_json();
    c.edit(j);
    auto t = hf_tokenizer::from_json(j.dump(), "tokenizer.json");
    ASSERT_FALSE(t) << c.label;
    EXPECT_EQ(code_of(t.error()), c.code) << c.label << ": " << describe(t.error());
    auto msg = context_of(t.error());
    EXPECT_EQ(msg.rfind("tokenizer.json: ", 0), 0u) << c.label << ": " << msg;
    EXPECT_NE(msg.find(c.reason), std::string::npos) << c.label << ": " << msg;
  }
  auto t = hf_tokenizer::from_json("{\"model\": [", "tokenizer.json");
  ASSERT_FALSE(t);
  EXPECT_EQ(code_of(t.error()), errc::parse_error);
  EXPECT_NE(context_of(t.error()).find("tokenizer.json: not valid JSON"), std::string::npos);
}

TEST(LoadTokenizer, ReadsDirectoryWithTokenizerConfig) {
  test::temp_dir dir;
  dir.write("model/tokenizer.json", small_tokenizer_json().dump());
  dir.write("model/tokenizer_config.json",
            json{{"bos_token", {{"content", "<|endoftext|>"}, {"special", true}}},
                 {"eos_token", "<|endoftext|>"},
                 {"pad_token", nullptr}}
                .dump());
  auto t = load_tokenizer(dir.file("model"));
  ASSERT_TRUE(t) << describe(t.error());
  EXPECT_EQ((*t)->bos_id(), 268);
  EXPECT_EQ((*t)->eos_id(), 268);
  EXPECT_FALSE((*t)->pad_id());
  EXPECT_EQ((*t)->encode(" the"), (ids{258}));

  auto by_file = load_tokenizer(dir.file("model/tokenizer.json"));
  ASSERT_TRUE(by_file);
  EXPECT_EQ((*by_file)->eos_id(), 268);

  dir.write("model/tokenizer_config.json", R"({"eos_token": "</s>"})");
  auto bad = load_tokenizer(dir.file("model"));
  ASSERT_FALSE(bad);
  EXPECT_EQ(code_of(bad.error()), errc::invalid_config);
  EXPECT_NE(context_of(bad.error())
                .find("tokenizer_config.json: eos_token: token '</s>' is not in the vocabulary"),
            std::string::npos)
      << context_of(bad.error());

  auto missing = load_tokenizer(dir.file("empty"));
  ASSERT_FALSE(missing);
  EXPECT_EQ(code_of(missing.error()), errc::not_found);
  EXPECT_NE(context_of(missing.error()).find("empty"), std::string::npos);

  dir.write("broken/tokenizer.json", R"({"model": {"type": "BPE", "vocab": {}, "merges": [1]}})");
  auto broken = load_tokenizer(dir.file("broken"));
  ASSERT_FALSE(broken);
  EXPECT_NE(context_of(broken.error()).find("broken/tokenizer.json: "), std::string::npos)
      << context_of(broken.error());
}

// ---- SentencePiece-style BPE (Llama 2, Mistral, Gemma) ---------------------------------

namespace {

// "▁" words over characters, <0xXX> byte tokens, <unk>, and the Llama 2
// pipeline: Prepend + Replace normalizers, a BOS template, the
// Replace / ByteFallback / Fuse / Strip decoders.
json sentencepiece_json() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    vocab[hex] = 3 + b;
  }
  int64_t next = 259;
  for (const char* t : {"\u2581", "h", "e", "l", "o", "w", "r", "d", "\u2581h", "\u2581he", "ll",
                        "\u2581hell", "\u2581hello", "\u2581w", "or", "\u2581wor", "\u2581world", "中"})
    vocab[t] = next++;
  json merges = {"\u2581 h", "\u2581h e", "l l", "\u2581he ll", "\u2581hell o", "\u2581 w", "o r",
                 "\u2581w or", "\u2581wor l"};
  vocab["\u2581worl"] = next++;
  merges.push_back("\u2581worl d");
  json added = json::array();
  for (int i = 0; i < 3; ++i)
    added.push_back({{"id", i}, {"content", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>"},
                     {"special", true}, {"normalized", false}});
  return {{"added_tokens", added},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers",
             {{{"type", "Prepend"}, {"prepend", "\u2581"}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}}},
          {"pre_tokenizer", nullptr},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                        {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders",
             {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
              {{"type", "ByteFallback"}},
              {{"type", "Fuse"}},
              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
          {"model",
           {{"type", "BPE"}, {"unk_token", "<unk>"}, {"fuse_unk", true}, {"byte_fallback", true},
            {"vocab", vocab}, {"merges", merges}}}};
}

} // namespace

TEST(HfTokenizer, SentencePieceStyleBpeWithByteFallback) {
  auto t = make(sentencepiece_json());
  const int64_t hello = *t.token_to_id("\u2581hello"), world = *t.token_to_id("\u2581world");
  EXPECT_EQ(t.encode("hello world"), (ids{hello, world}));
  EXPECT_EQ(t.encode("hello world", {true}), (ids{1, hello, world}));
  EXPECT_EQ(t.encode(""), ids{});
  EXPECT_EQ(t.encode("", {true}), (ids{1}));
  // Prepend fires once per piece between added tokens.
  EXPECT_EQ(t.encode("hello<s>world"), (ids{hello, 1, world}));
  // é is not in the vocabulary: its UTF-8 bytes as <0xXX> tokens.
  EXPECT_EQ(t.encode("\u00E9"), (ids{*t.token_to_id("\u2581"), 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(*t.decode(t.encode("hello world \u00E9 中")), "hello world \u00E9 中");
  EXPECT_EQ(*t.decode({1, hello, world}), "<s> hello world");
  EXPECT_EQ(*t.decode({1, hello, world}, {.skip_special_tokens = true}), "hello world");
  // A byte run that is not UTF-8: one U+FFFD per byte of the run.
  EXPECT_EQ(*t.decode({3 + 0xE4, 3 + 0xBD, hello}), "\uFFFD\uFFFD hello");
  EXPECT_EQ(t.id_to_token(3 + 0x0A), "<0x0A>");
  // Without byte fallback unknown characters become <unk>, fused.
  auto j = sentencepiece_json();
  j["model"]["byte_fallback"] = false;
  EXPECT_EQ(make(j).encode("\u00E9\u00E8"), (ids{*t.token_to_id("\u2581"), 0}));
  j["model"]["fuse_unk"] = false;
  EXPECT_EQ(make(j).encode("\u00E9\u00E8"), (ids{*t.token_to_id("\u2581"), 0, 0}));
}

TEST(HfTokenizer, InvalidUtf8IsReadAsReplacementCharacters) {
  auto t = make(small_tokenizer_json());
  // One U+FFFD (EF BF BD) per maximal ill-formed subsequence, as a binding
  // of the reference receives such bytes.
  EXPECT_EQ(t.encode("a\xFF"), t.encode("a\uFFFD"));
  EXPECT_EQ(t.encode("\xF0\x9F\x98"), t.encode("\uFFFD"));
  EXPECT_EQ(t.encode("\xC0\xAF"), t.encode("\uFFFD\uFFFD"));
}

TEST(LoadTokenizer, AddBosAndEosTokensOfTheConfigDecideTheSpecialTokens) {
  test::temp_dir dir;
  dir.write("m/tokenizer.json", sentencepiece_json().dump());
  auto load = [&](const json& config) {
    dir.write("m/tokenizer_config.json", config.dump());
    return load_tokenizer(dir.file("m"));
  };
  auto t = load({{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"add_bos_token", true},
                 {"add_eos_token", true}, {"model_max_length", 4096}});
  ASSERT_TRUE(t) << describe(t.error());
  const int64_t hello = *(*t)->token_to_id("\u2581hello");
  EXPECT_EQ((*t)->encode("hello", {true}), (ids{1, hello, 2}));
  EXPECT_EQ((*t)->encode("hello"), (ids{hello}));
  EXPECT_EQ((*t)->model_max_length(), 4096);
  t = load({{"bos_token", "<s>"}, {"add_bos_token", false}, {"model_max_length", 1e30}});
  ASSERT_TRUE(t);
  EXPECT_EQ((*t)->encode("hello", {true}), (ids{hello}));
  EXPECT_FALSE((*t)->model_max_length());
  t = load({{"eos_token", "</s>"}}); // no add_* keys: the template of tokenizer.json
  ASSERT_TRUE(t);
  EXPECT_EQ((*t)->encode("hello", {true}), (ids{1, hello}));
  auto bad = load({{"add_eos_token", true}});
  ASSERT_FALSE(bad);
  EXPECT_EQ(code_of(bad.error()), errc::invalid_config);
  EXPECT_NE(context_of(bad.error()).find("add_eos_token: true, but there is no eos_token"),
            std::string::npos)
      << context_of(bad.error());
  bad = load({{"model_max_length", -5}});
  ASSERT_FALSE(bad);
  EXPECT_NE(context_of(bad.error()).find("model_max_length: expected a positive length"),
            std::string::npos);
}
