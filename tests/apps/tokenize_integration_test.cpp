// The real `troupe tokenize` and `troupe generate` with the tokenizers of
// five real model families (tests/reference, installed by scripts/setup.sh):
// generate runs a random model of the tokenizer's vocabulary size and prints
// text; tokenize prints the ids the library computes, their pieces, and
// decodes them back.
#include "models/llama.hpp"
#include "models/tokenizer.hpp"
#include "runtime/file_io.hpp"
#include "runtime/jsonl.hpp"
#include "tests/models/tokenizer_reference.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <sstream>

using namespace troupe;
using nlohmann::json;

namespace {

std::string troupe_cmd() {
  return TROUPE_BINARY_PATH;
}

// An HF directory: a random 1-layer Llama with the tokenizer's vocabulary,
// and the tokenizer files.
std::string model_dir_for(const test::temp_dir& dir, const std::string& family) {
  auto src = test::real_tokenizer_dir(family);
  auto tok = models::load_tokenizer(src);
  EXPECT_TRUE(tok) << describe(tok.error());
  models::llama_config c;
  c.vocab_size = (*tok)->vocab_size();
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.max_position_embeddings = 128;
  if (auto eos = (*tok)->eos_id())
    c.eos_token_ids = {*eos};
  torch::manual_seed(11);
  auto m = models::make_llama(c, models::head_kind::lm);
  EXPECT_TRUE(m);
  auto out = dir.file(family);
  EXPECT_TRUE(models::save_pretrained(*m, out));
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    std::filesystem::copy_file(src + "/" + f, out + "/" + f);
  return out;
}

class TroupeTokenizer : public testing::TestWithParam<const char*> {
protected:
  void SetUp() override {
    if (auto why = test::reference_missing(); !why.empty())
      GTEST_SKIP() << why;
  }
};

TEST_P(TroupeTokenizer, GenerateRunsWithTheFamilysTokenizerAndPrintsText) {
  test::temp_dir dir;
  auto model = model_dir_for(dir, GetParam());
  int status = -1;
  auto out = test::run_command(troupe_cmd() + " generate --model " + model +
                                   " --prompt 'Hello, world! 你好' --max-tokens 6 --temperature 0 "
                                   "--ignore-eos --quiet 2>&1",
                               status);
  ASSERT_EQ(status, 0) << out;
  auto row = json::parse(out);
  EXPECT_EQ(row["token_ids"].size(), 6u) << out;
  ASSERT_TRUE(row["text"].is_string()) << out;
  // The printed text is the tokenizer's decoding of the generated ids.
  auto tok = models::load_tokenizer(model);
  ASSERT_TRUE(tok);
  auto text = (*tok)->decode(row["token_ids"].get<std::vector<int64_t>>());
  ASSERT_TRUE(text);
  EXPECT_EQ(row["text"].get<std::string>(), *text);
}

TEST_P(TroupeTokenizer, TokenizePrintsIdsAndPiecesAndDecodesThemBack) {
  auto dir = test::real_tokenizer_dir(GetParam());
  auto tok = models::load_tokenizer(dir);
  ASSERT_TRUE(tok);
  const std::string text = "Grüße, world!\n  12345 🤗";
  test::temp_dir tmp;
  auto input = tmp.write("in.txt", text);
  int status = -1;
  auto out =
      test::run_command(troupe_cmd() + " tokenize --model " + dir + " --json < " + input, status);
  ASSERT_EQ(status, 0) << out;
  auto j = json::parse(out);
  auto ids = (*tok)->encode(text);
  EXPECT_EQ(j["ids"].get<std::vector<int64_t>>(), ids);
  ASSERT_EQ(j["pieces"].size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(j["pieces"][i].get<std::string>(), *(*tok)->id_to_token(ids[i]));
  EXPECT_EQ(j["count"], ids.size());

  std::ostringstream list;
  for (auto id : ids)
    list << id << ",";
  out = test::run_command(troupe_cmd() + " tokenize --model " + dir + " --decode --json --text '" +
                              list.str() + "'",
                          status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_EQ(json::parse(out)["text"], *(*tok)->decode(ids));

  auto special = test::run_command(
      troupe_cmd() + " tokenize --model " + dir + " --add-special --text 'hi'", status);
  ASSERT_EQ(status, 0) << special;
  std::ostringstream want;
  auto with = (*tok)->encode("hi", {true});
  for (size_t i = 0; i < with.size(); ++i)
    want << (i ? " " : "") << with[i];
  EXPECT_EQ(special, want.str() + "\n");
}

// --chat: the text transformers' apply_chat_template renders (the jinja2
// reference, tests/reference/chat_template_reference.py) and the ids Hugging
// Face tokenizers gives that text.
TEST_P(TroupeTokenizer, TokenizeChatRendersAsTransformersAndEncodesAsTheReference) {
  int status = -1;
  test::run_command("/usr/bin/python3 -c 'import jinja2' > /dev/null 2>&1", status);
  if (status != 0)
    GTEST_SKIP() << "/usr/bin/python3 cannot import jinja2 (install python3-jinja2)";
  auto dir = test::real_tokenizer_dir(GetParam());
  auto config = json::parse(*runtime::read_file(dir + "/tokenizer_config.json"));
  if (!config.contains("chat_template"))
    GTEST_SKIP() << GetParam() << " has no chat template";
  auto token = [&](const char* key) -> json {
    if (!config.contains(key) || config[key].is_null())
      return nullptr;
    return config[key].is_object() ? config[key]["content"] : config[key];
  };
  const json messages = json::parse(R"([
    {"role": "system", "content": "Answer with a number."},
    {"role": "user", "content": "What is 12 + 7?"},
    {"role": "assistant", "content": "19"},
    {"role": "user", "content": "And 3 × 4, ¿sí?"}])");
  test::temp_dir tmp;
  auto conv = tmp.write("conv.json", messages.dump());
  for (bool gen : {true, false}) {
    auto out = test::run_command(troupe_cmd() + " tokenize --model " + dir + " --chat " + conv +
                                     (gen ? " --add-generation-prompt" : "") + " --json 2>&1",
                                 status);
    ASSERT_EQ(status, 0) << out;
    auto j = json::parse(out);
    json vars{{"messages", messages},
              {"tools", nullptr},
              {"documents", nullptr},
              {"add_generation_prompt", gen}};
    for (const char* key : {"bos_token", "eos_token"})
      if (auto t = token(key); !t.is_null())
        vars[key] = t;
    json request{
        {"cases", json::array({{{"template", config["chat_template"]}, {"variables", vars}}})}};
    auto in = tmp.write("request.json", request.dump());
    auto ref_out = tmp.file("reference.json");
    auto log =
        test::run_command("/usr/bin/python3 " + test::reference_dir() +
                              "/chat_template_reference.py '" + in + "' '" + ref_out + "' 2>&1",
                          status);
    ASSERT_EQ(status, 0) << log;
    auto ref = json::parse(*runtime::read_file(ref_out));
    ASSERT_TRUE(ref[0].contains("text")) << ref.dump();
    EXPECT_EQ(j["text"], ref[0]["text"]) << GetParam() << ", add_generation_prompt " << gen;
    std::string error;
    auto ids = test::run_reference(
        {{"tokenizer", dir + "/tokenizer.json"},
         {"texts", json::array({runtime::base64(ref[0]["text"].get<std::string>())})}},
        error);
    ASSERT_TRUE(error.empty()) << error;
    EXPECT_EQ(j["ids"], ids["encode"][0]["ids"]) << GetParam();
  }
}

INSTANTIATE_TEST_SUITE_P(Families, TroupeTokenizer,
                         testing::Values("llama2", "llama3", "qwen3", "gemma3", "deepseek_v3"));

TEST(TroupeTokenize, BadInputIsRefusedSayingWhat) {
  test::temp_dir dir;
  dir.write("m/tokenizer.json",
            R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}, "normalizer": null})");
  int status = -1;
  auto out = test::run_command(
      troupe_cmd() + " tokenize --model " + dir.file("m") + " --text x 2>&1", status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("model.type: model 'Unigram' is not supported"), std::string::npos) << out;
}

TEST(TroupeTokenize, BadIdsAreRefusedSayingWhichAndWhere) {
  if (auto why = test::reference_missing(); !why.empty())
    GTEST_SKIP() << why;
  int status = -1;
  auto llama = test::real_tokenizer_dir("llama3");
  auto out = test::run_command(
      troupe_cmd() + " tokenize --model " + llama + " --decode --text '1, 2, x3' 2>&1", status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("id 2: expected an integer, got 'x3'"), std::string::npos) << out;
  out = test::run_command(
      troupe_cmd() + " tokenize --model " + llama + " --decode --text '5 99999999' 2>&1", status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("id 99999999 at position 1 is not a token"), std::string::npos) << out;
}

} // namespace
