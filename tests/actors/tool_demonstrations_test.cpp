// Multi-turn demonstrations (NOTE [demonstration turns]): tool-using
// conversations read from files and generated from the add task become the
// tokens an episode of them would be — the model's turns (its calls written
// as its format spells them, then EOS) with loss, the tools' answers
// rendered as observations without — so SFT trains the layout RL samples.

#include "actors/rl/data.hpp"
#include "actors/rl/datasets.hpp"
#include "actors/rl/episodes.hpp"
#include "actors/rl/tasks.hpp"
#include "models/tokenizer.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

using namespace troupe;
using namespace troupe::actors::rl;
using json = nlohmann::ordered_json;

namespace {

prompt_encoder byte_encoder() {
  return prompt_encoder{std::make_shared<models::byte_tokenizer>(), false};
}

std::vector<int64_t> concat(std::initializer_list<std::vector<int64_t>> parts) {
  std::vector<int64_t> out;
  for (const auto& p : parts)
    out.insert(out.end(), p.begin(), p.end());
  return out;
}

} // namespace

TEST(ToolDemonstrations, TheAddTaskCallsTheCalculatorAndAnswersItsResult) {
  auto demos = to_tool_demonstrations({{"add:482+97=", "579"}, {"add:1+2=", "3"}});
  ASSERT_TRUE(demos) << describe(demos.error());
  ASSERT_EQ(demos->size(), 2u);
  const auto& d = (*demos)[0];
  EXPECT_EQ(d.prompt, "add:482+97=");
  EXPECT_EQ(d.response, "579");
  auto turns = json::parse(d.turns);
  ASSERT_EQ(turns.size(), 3u);
  auto calls = tool_calls_of(turns[0]);
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "calculator");
  EXPECT_EQ(calls[0].arguments, (json{{"expression", "482+97"}}));
  EXPECT_EQ(turns[1]["role"], "tool");
  EXPECT_EQ(turns[1]["content"], "579");
  EXPECT_EQ(json::parse(d.tools), json::array({calculator_tool()}));
  // Rows that are not the add task's, or whose answer is not the sum.
  EXPECT_FALSE(to_tool_demonstrations({{"sort:321", "123"}}));
  EXPECT_FALSE(to_tool_demonstrations({{"add:1+2=", "4"}}));
}

TEST(ToolDemonstrations, TokensAreTheEpisodesLayoutWithLossOnTheModelsTurnsOnly) {
  auto enc = byte_encoder();
  const auto d = to_tool_demonstrations({{"add:482+97=", "579"}}).value().front();
  for (auto format : {models::tool_call_format::hermes, models::tool_call_format::llama3_json}) {
    SCOPED_TRACE(to_string(format));
    auto t = render_demonstration(enc, d, format);
    ASSERT_TRUE(t) << describe(t.error());
    // The first prompt as the calculator environment's episode has it.
    auto first =
        render_first_prompt(enc, observation{{}, "add:482+97="}, json::array({calculator_tool()}));
    ASSERT_TRUE(first);
    EXPECT_EQ(t->prompt, *first);
    // Call + EOS, the tool's answer as an observation, the answer + EOS.
    const models::tool_call call{"calculator", json{{"expression", "482+97"}}};
    auto call_turn = enc.response(models::write_tool_calls("", {call}, format));
    auto obs = render_observation(enc, observation{{{"tool", "579", "calculator", "call_1_1"}}, ""},
                                  json::array({calculator_tool()}));
    ASSERT_TRUE(obs);
    auto answer = enc.response("579");
    EXPECT_EQ(t->tokens, concat({call_turn, *obs, answer}));
    std::vector<float> mask(call_turn.size(), 1.0f);
    mask.insert(mask.end(), obs->size(), 0.0f);
    mask.insert(mask.end(), answer.size(), 1.0f);
    EXPECT_EQ(t->loss_mask, mask);
    // The model's first turn reads back as the call it demonstrates.
    auto read = read_model_turn(enc, call_turn, format, json::array({calculator_tool()}));
    ASSERT_TRUE(read);
    EXPECT_TRUE(read->errors.empty());
    ASSERT_EQ(read->parsed.calls.size(), 1u);
    EXPECT_EQ(read->parsed.calls[0], call);
  }
}

TEST(ToolDemonstrations, AShareOfTheAddTasksDemonstrationsAnswersWithoutTheTool) {
  data_config c;
  c.task = task_kind::add;
  c.min_digits = 2;
  c.max_digits = 3;
  c.train_size = 40;
  c.eval_size = 4;
  c.sft_tool_calls = true;
  auto turn_counts = [&](double share, int64_t seed) {
    c.sft_tool_call_share = share;
    c.seed = seed;
    auto d = load_job_data(c, {}, {true, false});
    EXPECT_TRUE(d) << describe(d.error());
    std::vector<size_t> counts;
    const auto rows = d->sft.all().value();
    for (const auto& demo : rows) {
      EXPECT_EQ(json::parse(demo.tools), json::array({calculator_tool()}))
          << "the tool is offered in every demonstration";
      counts.push_back(json::parse(demo.turns).size());
    }
    return counts;
  };
  auto all_call = turn_counts(1.0, 7);
  EXPECT_EQ(std::count(all_call.begin(), all_call.end(), 3u), 40);
  auto quarter = turn_counts(0.25, 7);
  EXPECT_EQ(std::count(quarter.begin(), quarter.end(), 3u), 10);
  EXPECT_EQ(std::count(quarter.begin(), quarter.end(), 1u), 30);
  EXPECT_EQ(turn_counts(0.25, 7), quarter) << "drawn by the seed";
  EXPECT_NE(turn_counts(0.25, 8), quarter) << "another seed, another draw";
  auto none = turn_counts(0.0, 7);
  EXPECT_EQ(std::count(none.begin(), none.end(), 1u), 40);

  // A direct answer is the episode's first prompt (tools offered) and the
  // answer + EOS, all of it the model's.
  c.sft_tool_call_share = 0.0;
  auto d = load_job_data(c, {}, {true, false}).value().sft.all().value().front();
  auto enc = byte_encoder();
  auto t = render_demonstration(enc, d, models::tool_call_format::hermes);
  ASSERT_TRUE(t) << describe(t.error());
  auto first =
      render_first_prompt(enc, observation{{}, d.prompt}, json::array({calculator_tool()}));
  ASSERT_TRUE(first);
  EXPECT_EQ(t->prompt, *first);
  EXPECT_EQ(t->tokens, enc.response(d.response));
  EXPECT_EQ(t->loss_mask, std::vector<float>(t->tokens.size(), 1.0f));
}

TEST(ToolDemonstrations, ConversationFilesGiveTurnsAndBadOnesNameTheField) {
  test::temp_dir dir;
  const std::string good =
      R"({"messages": [{"role": "system", "content": "be exact"}, {"role": "user", "content": "2*3?"},)"
      R"( {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",)"
      R"( "function": {"name": "calculator", "arguments": "{\"expression\": \"2*3\"}"}}]},)"
      R"( {"role": "tool", "tool_call_id": "c1", "content": "6"},)"
      R"( {"role": "assistant", "content": "6"}], "tools": [{"type": "function", "function":)"
      R"( {"name": "calculator", "parameters": {"type": "object"}}}]})";
  const std::string plain =
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})";
  auto rows = load_demonstrations(dir.write("ok.jsonl", good + "\n" + plain + "\n"));
  ASSERT_TRUE(rows) << describe(rows.error());
  ASSERT_EQ(rows->size(), 2u);
  const auto& d = (*rows)[0];
  EXPECT_EQ(json::parse(d.messages).size(), 2u) << "the prompt: system and user";
  EXPECT_EQ(json::parse(d.turns).size(), 3u);
  EXPECT_EQ(d.response, "6");
  EXPECT_EQ(json::parse(d.tools).size(), 1u);
  EXPECT_TRUE((*rows)[1].turns.empty()) << "no tool message: a one-turn demonstration";
  EXPECT_EQ((*rows)[1].response, "yo");
  auto t = render_demonstration(byte_encoder(), d, models::tool_call_format::hermes);
  ASSERT_TRUE(t) << describe(t.error());
  EXPECT_EQ(std::count(t->loss_mask.begin(), t->loss_mask.end(), 0.0f),
            static_cast<long>(std::string{"<tool_response>6</tool_response>\n"}.size()));

  struct bad {
    std::string line, reason;
  };
  for (const auto& [line, reason] : std::vector<bad>{
           {R"({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "6"}]})",
            "must end in an assistant message with content"},
           {R"({"messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "6"},)"
            R"( {"role": "critic", "content": "x"}, {"role": "assistant", "content": "6"}]})",
            "field \"messages[2].role\": a tool-using demonstration's turns are assistant and "
            "tool messages, got 'critic'"},
           {R"({"prompt": "q", "response": "r", "tools": {"a": 1}})",
            "field \"tools\": expected a list of tools, got object"}}) {
    auto path = dir.write("bad.jsonl", line + "\n");
    auto r = load_demonstrations(path);
    ASSERT_FALSE(r) << line;
    EXPECT_NE(context_of(r.error()).find(path + ":1: "), std::string::npos)
        << context_of(r.error());
    EXPECT_NE(context_of(r.error()).find(reason), std::string::npos) << context_of(r.error());
  }
}
