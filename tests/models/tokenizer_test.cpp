#include "models/tokenizer.hpp"
#include "models/tokenizer_split.hpp"
#include "models/tokenizer_unicode.hpp"
#include "runtime/error.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <functional>
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
  vocab["Ġworld"] = 268; // reachable only with ignore_merges
  return json{
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", json::array({{{"id", 267},
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

bpe_tokenizer make(const json& j) {
  auto t = bpe_tokenizer::from_json(j.dump(), "tokenizer.json");
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

// ---- byte-level BPE ------------------------------------------------------------------

TEST(BpeTokenizer, EncodesWithRankedMerges) {
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
  EXPECT_EQ(t.pre_tokenize("Hello world's 123"), (strings{"Hello", " world", "'s", " 123"}));
  EXPECT_EQ(t.id_to_token(258), "Ġthe");
  EXPECT_EQ(t.id_to_token(32), "Ġ");
  EXPECT_EQ(t.token_to_id("Ġthe"), 258);
  EXPECT_EQ(t.token_to_id("<|endoftext|>"), 267);
  EXPECT_FALSE(t.token_to_id("nope"));
}

TEST(BpeTokenizer, AddedTokensAreMatchedWholeFirst) {
  auto t = make(small_tokenizer_json());
  EXPECT_EQ(t.encode("<|endoftext|> the<|endoftext|>"), (ids{267, 258, 267}));
  EXPECT_EQ(t.encode("hello<|endoftext|>"), (ids{257, 259, 111, 267}));
  EXPECT_EQ(t.encode("<|endoftext"), (ids{60, 124, 101, 110, 100, 111, 102, 116, 101, 120, 116}));
  EXPECT_EQ(t.encode("a<tool>b"), (ids{97, 269, 98}));
  EXPECT_TRUE(t.is_special(267));
  EXPECT_FALSE(t.is_special(269));
  EXPECT_EQ(*t.decode({257, 267, 258}), "he<|endoftext|> the");
  EXPECT_EQ(*t.decode({257, 267, 258, 269}, {.skip_special_tokens = true}), "he the<tool>");
}

TEST(BpeTokenizer, IgnoreMergesTakesWholeVocabularyWords) {
  auto j = small_tokenizer_json();
  EXPECT_EQ(make(j).encode(" world"), (ids{264, 108, 100}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(make(j).encode(" world"), (ids{268}));
}

TEST(BpeTokenizer, SplitPatternFamiliesAndNfc) {
  auto llama = make(split_tokenizer_json(split_pattern::llama3, false));
  EXPECT_EQ(llama.pre_tokenize("Hello world's 1234567"),
            (strings{"Hello", " world", "'s", " ", "123", "456", "7"}));
  EXPECT_EQ(llama.encode("Hello world's 12"), (ids{261, 111, 264, 108, 100, 266, 32, 265}));
  auto qwen = make(split_tokenizer_json(split_pattern::qwen2, true));
  EXPECT_EQ(qwen.encode(" 12"), (ids{32, 49, 50}));     // one digit per piece: "12" never merges
  EXPECT_EQ(qwen.encode("e\u0301"), (ids{0xC3, 0xA9})); // NFC first: é
  EXPECT_EQ(llama.encode("e\u0301"), (ids{101, 0xCC, 0x81}));
}

TEST(BpeTokenizer, RoundTripsMultilingualTextForEveryFamily) {
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

TEST(BpeTokenizer, DecodeRejectsBadIdsNamingThem) {
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

TEST(BpeTokenizer, IsSafeToShareAcrossThreads) {
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

TEST(BpeTokenizer, RejectsMalformedJsonNamingThePath) {
  std::vector<bad_tokenizer> cases = {
      {"merge_not_string", [](json& j) { j["model"]["merges"][1] = 5; }, errc::parse_error,
       "model.merges[1]: expected a string or a pair, got 5"},
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
       "model.vocab.he: expected a non-negative 32-bit integer id, got \"7\""},
      {"vocab_id_negative", [](json& j) { j["model"]["vocab"]["he"] = -3; }, errc::parse_error,
       "model.vocab.he: expected a non-negative 32-bit integer id, got -3"},
      {"vocab_duplicate_id", [](json& j) { j["model"]["vocab"]["zzz"] = 5; }, errc::parse_error,
       "is also the id of"},
      {"sparse_ids", [](json& j) { j["model"]["vocab"]["zzz"] = 1000000000; }, errc::parse_error,
       "id 1000000000 is far beyond"},
      {"missing_byte", [](json& j) { j["model"]["vocab"].erase("Ā"); }, errc::parse_error,
       "model.vocab: missing the byte-level symbol 'Ā' of byte 0x00"},
      {"model_type", [](json& j) { j["model"]["type"] = "Unigram"; }, errc::unsupported,
       "model.type: 'Unigram' is not supported"},
      {"byte_fallback", [](json& j) { j["model"]["byte_fallback"] = true; }, errc::unsupported,
       "model.byte_fallback"},
      {"added_no_id", [](json& j) { j["added_tokens"][0].erase("id"); }, errc::parse_error,
       "added_tokens[0].id: expected a non-negative 32-bit integer"},
      {"added_bad_flag", [](json& j) { j["added_tokens"][1]["special"] = "yes"; },
       errc::parse_error, "added_tokens[1].special: expected a boolean, got string"},
      {"normalizer",
       [](json& j) {
         j["normalizer"] = {{"type", "NFKC"}};
       },
       errc::unsupported, "normalizer.type: normalizer 'NFKC' is not supported"},
      {"pre_tokenizer",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Metaspace"}};
       },
       errc::unsupported, "pre_tokenizer.type: pre-tokenizer 'Metaspace' is not supported"},
      {"pre_tokenizer_null", [](json& j) { j["pre_tokenizer"] = nullptr; }, errc::unsupported,
       "pre_tokenizer: null"},
      {"unknown_regex",
       [](json& j) {
         j = split_tokenizer_json(split_pattern::llama3, false);
         j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+";
       },
       errc::unsupported,
       "pre_tokenizer.pretokenizers[0].pattern.Regex: unknown split pattern '\\w+'"},
      {"decoder",
       [](json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       errc::unsupported, "decoder.type: decoder 'WordPiece' is not supported"},
  };
  for (const auto& c : cases) {
    auto j = small_tokenizer_json();
    c.edit(j);
    auto t = bpe_tokenizer::from_json(j.dump(), "tokenizer.json");
    ASSERT_FALSE(t) << c.label;
    EXPECT_EQ(code_of(t.error()), c.code) << c.label << ": " << describe(t.error());
    auto msg = context_of(t.error());
    EXPECT_EQ(msg.rfind("tokenizer.json: ", 0), 0u) << c.label << ": " << msg;
    EXPECT_NE(msg.find(c.reason), std::string::npos) << c.label << ": " << msg;
  }
  auto t = bpe_tokenizer::from_json("{\"model\": [", "tokenizer.json");
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
  EXPECT_EQ((*t)->bos_id(), 267);
  EXPECT_EQ((*t)->eos_id(), 267);
  EXPECT_FALSE((*t)->pad_id());
  EXPECT_EQ((*t)->encode(" the"), (ids{258}));

  auto by_file = load_tokenizer(dir.file("model/tokenizer.json"));
  ASSERT_TRUE(by_file);
  EXPECT_EQ((*by_file)->eos_id(), 267);

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
