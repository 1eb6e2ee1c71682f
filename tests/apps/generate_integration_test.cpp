// Runs the real `troupe generate` on a tiny random model saved as an HF
// directory: JSONL in, JSONL out, greedy results equal the dense model's, and
// a malformed prompts file is reported as file:line.
#include "kernels/cpu/decode_isa.hpp"
#include "models/llama.hpp"
#include "tests/support/temp_dir.hpp"

#include "tests/support/process.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <array>
#include <cstdio>
#include <sstream>

using namespace troupe;

namespace {

using test::run_command;

models::llama_model tiny_byte_model() {
  models::llama_config c;
  c.vocab_size = 259; // the byte tokenizer's vocabulary
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.eos_token_ids = {258};
  torch::manual_seed(4);
  auto m = models::make_llama(c, models::head_kind::lm);
  EXPECT_TRUE(m);
  (*m)->eval();
  return *m;
}

} // namespace

TEST(TroupeGenerate, JsonlPromptsGiveGreedyOutputsOfTheModel) {
  test::temp_dir dir;
  auto model = tiny_byte_model();
  ASSERT_TRUE(models::save_pretrained(model, dir.file("model")));
  auto prompts = dir.write("p.jsonl", "{\"id\": \"a\", \"prompt\": \"hi\"}\n"
                                      "{\"id\": \"b\", \"prompt_ids\": [10, 20, 30]}\n");
  int status = -1;
  auto out = run_command(std::string{TROUPE_BINARY_PATH} + " generate --model " + dir.file("model") +
                   " --prompts " + prompts + " --max-tokens 5 --temperature 0 --ignore-eos --quiet",
                 status);
  ASSERT_EQ(status, 0) << out;
  std::istringstream lines(out);
  std::string line;
  std::vector<nlohmann::json> rows;
  while (std::getline(lines, line))
    rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 2u);
  // Text prompts get the byte tokenizer's <bos> (257); prompt_ids are used as given.
  std::vector<std::vector<int64_t>> prompts_ids{{257, 'h', 'i'}, {10, 20, 30}};
  torch::NoGradGuard ng;
  for (size_t r = 0; r < 2; ++r) {
    auto ids = prompts_ids[r];
    std::vector<int64_t> expect;
    for (int i = 0; i < 5; ++i) {
      auto t = torch::tensor(ids, torch::kLong).unsqueeze(0);
      auto next = model->forward(t, {}).select(1, t.size(1) - 1).argmax(-1).item<int64_t>();
      expect.push_back(next);
      ids.push_back(next);
    }
    EXPECT_EQ(rows[r]["token_ids"].get<std::vector<int64_t>>(), expect) << rows[r].dump();
    EXPECT_EQ(rows[r]["logprobs"].size(), 5u);
    EXPECT_EQ(rows[r]["finish_reason"], "length");
    EXPECT_EQ(rows[r]["weight_version"], 0);
  }
  EXPECT_EQ(rows[0]["id"], "a");
  EXPECT_EQ(rows[1]["id"], "b");
}

TEST(TroupeGenerate, MalformedPromptLineIsReportedWithFileAndLine) {
  test::temp_dir dir;
  auto model = tiny_byte_model();
  ASSERT_TRUE(models::save_pretrained(model, dir.file("model")));
  auto prompts = dir.write("bad.jsonl", "{\"prompt\": \"ok\"}\n{\"prompt\": 7}\n");
  int status = -1;
  auto out = run_command(std::string{TROUPE_BINARY_PATH} + " generate --model " + dir.file("model") +
                   " --prompts " + prompts + " 2>&1",
                 status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find(prompts + ":2: field 'prompt': expected a string, got number"), std::string::npos)
    << out;
}

TEST(TroupeGenerate, PromptLongerThanContextIsRejected) {
  test::temp_dir dir;
  auto model = tiny_byte_model();
  ASSERT_TRUE(models::save_pretrained(model, dir.file("model")));
  int status = -1;
  auto out = run_command(std::string{TROUPE_BINARY_PATH} + " generate --model " + dir.file("model") +
                   " --prompt " + std::string(63, 'x') + " 2>&1",
                 status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("request '0': prompt: 64 tokens do not fit the context of 64"), std::string::npos)
    << out;
}

// NOTE [decode isa]: --decode-isa runs the path it names: every path this
// CPU supports gives the same greedy samples (three of one prompt: batched
// steps, from the packed panels); a path it lacks, or no path at all, is
// refused before any work.
TEST(TroupeGenerate, EveryInstructionSetPathGivesTheSameSamples) {
  test::temp_dir dir;
  auto model = tiny_byte_model();
  ASSERT_TRUE(models::save_pretrained(model, dir.file("model")));
  auto generate = [&](const std::string& isa, int& status) {
    return run_command(std::string{TROUPE_BINARY_PATH} + " generate --model " + dir.file("model") +
                           " --prompt hello -n 3 --max-tokens 6 " +
                           "--temperature 0 --ignore-eos --quiet --decode-panels on " +
                           "--decode-isa " + isa + " 2>&1",
                       status);
  };
  auto rows_of = [](const std::string& out) {
    std::istringstream lines(out);
    std::vector<nlohmann::json> rows;
    for (std::string line; std::getline(lines, line);)
      rows.push_back(nlohmann::json::parse(line));
    return rows;
  };
  int status = -1;
  const auto baseline = generate("baseline", status);
  ASSERT_EQ(status, 0) << baseline;
  const auto reference = rows_of(baseline);
  ASSERT_EQ(reference.size(), 3u);
  for (auto isa : kernels::cpu::supported_decode_isas()) {
    auto name = std::string{to_string(isa)};
    auto out = generate(name, status);
    ASSERT_EQ(status, 0) << out;
    auto rows = rows_of(out);
    ASSERT_EQ(rows.size(), 3u) << out;
    for (size_t r = 0; r < rows.size(); ++r) {
      // The same tokens; log-probs to float rounding (sums in another order).
      EXPECT_EQ(rows[r]["token_ids"], reference[r]["token_ids"]) << name;
      auto lp = rows[r]["logprobs"].get<std::vector<double>>();
      auto want = reference[r]["logprobs"].get<std::vector<double>>();
      ASSERT_EQ(lp.size(), want.size());
      for (size_t i = 0; i < lp.size(); ++i)
        EXPECT_NEAR(lp[i], want[i], 1e-5) << name << ", sample " << r << ", token " << i;
    }
  }
  for (auto isa : {kernels::cpu::decode_isa::avx512, kernels::cpu::decode_isa::avx2}) {
    if (kernels::cpu::cpu_supports(isa))
      continue;
    auto out = generate(std::string{to_string(isa)}, status);
    EXPECT_NE(status, 0);
    EXPECT_NE(out.find("engine.decode_isa: " + std::string{to_string(isa)} + ": this CPU lacks"),
              std::string::npos)
        << out;
  }
  auto out = generate("avx3", status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--decode-isa"), std::string::npos) << out;
}

// --batch-invariant: a request's samples and log-probs are the same alone
// and batched with others (sample 0 of -n 8 is the single sample: NOTE
// [batch-invariant forward]).
TEST(TroupeGenerate, BatchInvariantSamplesAreTheSameAloneAndBatched) {
  test::temp_dir dir;
  auto model = tiny_byte_model();
  ASSERT_TRUE(models::save_pretrained(model, dir.file("model")));
  auto first_row = [&](int n) {
    int status = -1;
    auto out = run_command(std::string{TROUPE_BINARY_PATH} + " generate --model " +
                               dir.file("model") + " --prompt hello -n " + std::to_string(n) +
                               " --max-tokens 8 --temperature 1 --seed 5 --ignore-eos --quiet "
                               "--batch-invariant 2>&1",
                           status);
    EXPECT_EQ(status, 0) << out;
    std::istringstream lines(out);
    std::string line;
    std::getline(lines, line);
    return nlohmann::json::parse(line, nullptr, false);
  };
  auto alone = first_row(1), batched = first_row(8);
  ASSERT_FALSE(alone.is_discarded());
  EXPECT_EQ(alone["token_ids"], batched["token_ids"]);
  EXPECT_EQ(alone["logprobs"], batched["logprobs"]) << "the same floats, printed alike";
}
