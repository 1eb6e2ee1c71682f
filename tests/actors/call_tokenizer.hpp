#pragma once
// A tokenizer whose pieces include whole tool calls, and the tiny model it
// fits, for multi-turn rollouts (NOTE [episodes]) with a random model.

#include "models/llama.hpp"
#include "models/tokenizer.hpp"
#include "tests/actors/tiny_engine.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace troupe::test {

// A tokenizer over the tiny model's 50 ids whose pieces include whole tool
// calls, so a random model writes calls — valid, malformed and of an
// unknown tool — as one token each. 0 pad, 1 BOS, 2 EOS; text is encoded
// byte by byte into ids 10..49.
class call_tokenizer final : public models::tokenizer {
public:
  static constexpr int64_t valid_call = 7, malformed_call = 8, unknown_tool = 9;

  call_tokenizer() { EXPECT_TRUE(set_special_ids({1, 2, 0})); }

  using models::tokenizer::encode;

  std::vector<int64_t> encode(std::string_view text, const models::encode_options&) const override {
    std::vector<int64_t> out;
    for (unsigned char c : text)
      out.push_back(10 + c % 40);
    return out;
  }
  expected<std::string> decode(const std::vector<int64_t>& ids,
                               const models::decode_options& opts) const override {
    std::string out;
    for (auto id : ids) {
      if (id < 0 || id >= 50)
        return make_error(errc::out_of_range, "id " + std::to_string(id));
      if (id < 3 && opts.skip_special_tokens)
        continue;
      out += piece(id);
    }
    return out;
  }
  int64_t vocab_size() const override { return 50; }
  std::optional<int64_t> token_to_id(std::string_view) const override { return std::nullopt; }
  bool is_special(int64_t id) const override { return id < 3; }
  std::optional<std::string> id_to_token(int64_t id) const override { return piece(id); }

  static std::string piece(int64_t id) {
    switch (id) {
    case 0:
      return "<pad>";
    case 1:
      return "<s>";
    case 2:
      return "</s>";
    case valid_call:
      return R"(<tool_call>{"name": "calculator", "arguments": {"expression": "12345678901234567890 * 3"}}</tool_call>)";
    case malformed_call:
      return "<tool_call>{oops</tool_call>";
    case unknown_tool:
      return R"(<tool_call>{"name": "search", "arguments": {}}</tool_call>)";
    default:
      return std::string(1, static_cast<char>('a' + id % 26));
    }
  }
};

// The tiny model with EOS = 2 (so turns end), seeded.
inline models::llama_model episode_model() {
  auto c = actors::inference::testing::tiny_config();
  c.eos_token_ids = {2};
  c.max_position_embeddings = 256;
  torch::manual_seed(5);
  auto m = models::make_llama(c, models::head_kind::lm);
  EXPECT_TRUE(m) << describe(m.error());
  (*m)->eval();
  return *m;
}

/// The log-probs of `tokens` after `prompt` by a forward of the whole
/// sequence (temperature 1): what a sampled continuation of exactly that
/// sequence was scored.
inline std::vector<float> teacher_forced(models::llama_model& m, const std::vector<int64_t>& prompt,
                                         const std::vector<int64_t>& tokens) {
  torch::NoGradGuard ng;
  std::vector<int64_t> all = prompt;
  all.insert(all.end(), tokens.begin(), tokens.end());
  auto ids = torch::tensor(all, torch::kLong).unsqueeze(0);
  auto lp = torch::log_softmax(m->forward(ids, {}).squeeze(0).to(torch::kFloat), -1);
  std::vector<float> out;
  for (size_t j = 0; j < tokens.size(); ++j)
    out.push_back(lp[static_cast<int64_t>(prompt.size() + j - 1)][tokens[j]].item<float>());
  return out;
}

} // namespace troupe::test
