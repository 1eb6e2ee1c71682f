// The OpenAI-compatible endpoint (NOTE [agent gateway], [agent book]): a
// Python agent loop on nothing but urllib, as a real process, talks to a
// real rollout through it; what the book recorded is checked token by token
// against what the engine served — the trajectory's tokens are the model's
// completions and the rendered new messages, its log-probs those the client
// was answered and those of the whole sequence. Streaming, rewritten
// histories, rewards and the errors of a hostile or careless client.

#include "actors/actor_system.hpp"
#include "actors/rl/agent_book.hpp"
#include "cluster/agent_gateway.hpp"
#include "tests/actors/call_tokenizer.hpp"
#include "tests/cluster/control_harness.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <sstream>

using namespace troupe;
using namespace troupe::actors::rl;
using troupe::test::call_tokenizer;
using json = nlohmann::json;

namespace {

const std::string key = "s3cret-key";

class AgentGateway : public ::testing::Test {
protected:
  AgentGateway() : sys{(actors::configure(cfg), cfg)} {}

  void SetUp() override {
    actors::inference::engine_config c;
    c.num_blocks = 256;
    c.block_size = 4;
    auto r = actors::inference::spawn_rollout(sys, model, c);
    ASSERT_TRUE(r) << describe(r.error());
    rollout = *r;
    book =
        std::make_shared<agent_book>(prompt_encoder{tok, false}, models::tool_call_format::hermes);
    cluster::gateway_options o;
    o.key = key;
    o.defaults.temperature = 1.0;
    o.defaults.max_tokens = 16;
    o.max_context = 200;
    auto g = cluster::agent_gateway::start(sys, rollout, book, o);
    ASSERT_TRUE(g) << describe(g.error());
    gateway = std::move(*g);
  }
  void TearDown() override {
    if (gateway)
      gateway->stop();
    if (rollout)
      caf::anon_send_exit(rollout, caf::exit_reason::user_shutdown);
  }

  // The agent loop (tests/cluster/agent_client.py) of `episode`; its
  // answers, one JSON object each.
  std::vector<json> run_agent(const std::string& episode, std::vector<std::string> flags = {}) {
    std::vector<std::string> args{"/usr/bin/python3",
                                  std::string{TROUPE_SOURCE_DIR} + "/tests/cluster/agent_client.py",
                                  "--base-url",
                                  gateway->base_url(episode),
                                  "--key",
                                  key};
    args.insert(args.end(), flags.begin(), flags.end());
    auto r = test::run_process(args, 120);
    EXPECT_EQ(r.code, 0) << r.out << r.err;
    std::vector<json> out;
    std::istringstream lines{r.out};
    for (std::string line; std::getline(lines, line);)
      if (!line.empty())
        out.push_back(json::parse(line));
    return out;
  }

  httplib::Result post(const std::string& path, const json& body, bool with_key = true) {
    httplib::Client cli{"127.0.0.1", gateway->port()};
    httplib::Headers h;
    if (with_key)
      h.emplace("Authorization", "Bearer " + key);
    return cli.Post(path, h, body.dump(), "application/json");
  }

  caf::actor_system_config cfg;
  caf::actor_system sys;
  models::llama_model model = test::episode_model();
  std::shared_ptr<call_tokenizer> tok = std::make_shared<call_tokenizer>();
  actors::inference::rollout_actor rollout;
  std::shared_ptr<agent_book> book;
  std::unique_ptr<cluster::agent_gateway> gateway;
};

} // namespace

TEST_F(AgentGateway, ATwoTurnAgentLoopIsRecordedAsTheTokensTheEngineServed) {
  auto answers = run_agent("ep-1");
  ASSERT_EQ(answers.size(), 2u);
  auto got = book->take("ep-1");
  ASSERT_TRUE(got);
  ASSERT_EQ(got->trajectories.size(), 1u) << "the second call extends the first";
  const auto& t = got->trajectories[0];
  EXPECT_EQ(t.turns, 2);
  // The first prompt: the user message in the plain rendering (no chat
  // template), BOS first.
  EXPECT_EQ(t.prompt, encode_prompt(*tok, "what is 2 times 3?\n"));
  // Spans: completion 1 (loss), the new messages (no loss), completion 2.
  std::vector<std::pair<float, std::vector<int64_t>>> spans;
  for (size_t j = 0; j < t.tokens.size(); ++j) {
    if (spans.empty() || spans.back().first != t.loss_mask[j])
      spans.push_back({t.loss_mask[j], {}});
    spans.back().second.push_back(t.tokens[j]);
  }
  ASSERT_EQ(spans.size(), 3u);
  EXPECT_EQ(spans[0].first, 1.0f);
  EXPECT_EQ(spans[2].first, 1.0f);
  const bool called = answers[0]["message"].contains("tool_calls");
  EXPECT_EQ(spans[1].second,
            tok->encode(called ? "<tool_response>6</tool_response>\n" : "use the calculator\n"))
      << "the new messages, rendered once";
  // The client's log-probs are the recorded ones, and the whole sequence's.
  std::vector<float> served;
  for (const auto& a : answers)
    for (const auto& lp : a["logprobs"])
      served.push_back(lp.get<float>());
  std::vector<float> recorded;
  for (size_t j = 0; j < t.tokens.size(); ++j)
    if (t.loss_mask[j] == 1.0f)
      recorded.push_back(t.logprobs[j]);
  EXPECT_EQ(served, recorded);
  auto forced = test::teacher_forced(model, t.prompt, t.tokens);
  for (size_t j = 0; j < t.tokens.size(); ++j)
    if (t.loss_mask[j] == 1.0f) {
      EXPECT_NEAR(t.logprobs[j], forced[j], 2e-4) << j;
    }
  // The second call's prompt was the trajectory so far.
  EXPECT_EQ(answers[1]["usage"]["prompt_tokens"].get<size_t>(),
            t.prompt.size() + spans[0].second.size() + spans[1].second.size());
  EXPECT_EQ(book->history_rewrites(), 0);
}

TEST_F(AgentGateway, AStreamedLoopAndARewrittenHistory) {
  auto streamed = run_agent("ep-2", {"--stream"});
  ASSERT_EQ(streamed.size(), 2u);
  auto s = book->take("ep-2");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->trajectories.size(), 1u) << "a streamed answer echoed back extends the trajectory";
  auto rewritten = run_agent("ep-3", {"--rewrite"});
  ASSERT_EQ(rewritten.size(), 3u);
  EXPECT_EQ(book->history_rewrites(), 1);
  auto r = book->take("ep-3");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->trajectories.size(), 2u);
  EXPECT_EQ(r->trajectories[0].turns, 2);
  EXPECT_EQ(r->trajectories[1].turns, 1);
  EXPECT_EQ(r->trajectories[1].prompt, encode_prompt(*tok, "start again\n"));
}

TEST_F(AgentGateway, RewardsAndErrorsComeInOpenAIsForm) {
  json chat{{"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};
  auto expect_error = [&](const std::string& path, const json& body, int status,
                          const std::string& param_or_code, bool with_key = true) {
    auto r = post(path, body, with_key);
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, status) << r->body;
    auto e = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << r->body;
    EXPECT_TRUE(e["error"]["param"] == param_or_code || e["error"]["code"] == param_or_code)
        << r->body;
  };
  expect_error("/e/ep-4/v1/chat/completions", chat, 401, "invalid_api_key", false);
  expect_error("/v1/chat/completions", chat, 400, "missing_episode");
  auto with = [&](const char* k, json v) {
    auto b = chat;
    b[k] = std::move(v);
    return b;
  };
  expect_error("/e/ep-4/v1/chat/completions", with("temperature", -1), 400, "temperature");
  expect_error("/e/ep-4/v1/chat/completions", with("n", 2), 400, "n");
  expect_error("/e/ep-4/v1/chat/completions", with("stop", "\n"), 400, "stop");
  expect_error("/e/ep-4/v1/chat/completions", with("messages", json::array()), 400, "messages");
  expect_error("/e/ep-4/v1/completions", {{"prompt", 3}}, 400, "prompt");
  expect_error(
      "/e/ep-4/v1/chat/completions",
      with("messages", json::array({{{"role", "user"}, {"content", std::string(300, 'x')}}})), 400,
      "context_length_exceeded");
  {
    httplib::Client cli{"127.0.0.1", gateway->port()};
    auto deep = std::string(5000, '[') + std::string(5000, ']');
    auto r = cli.Post("/e/ep-4/v1/chat/completions", {{"Authorization", "Bearer " + key}}, deep,
                      "application/json");
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 400) << r->body;
  }
  // A completion, then its episode's reward, once.
  auto ok = post("/e/ep-4/v1/completions", {{"prompt", "abc"}, {"max_tokens", 3}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  auto reward = post("/v1/episodes/ep-4/reward", {{"reward", 0.5}});
  ASSERT_TRUE(reward);
  EXPECT_EQ(reward->status, 200) << reward->body;
  expect_error("/v1/episodes/ep-4/reward", {{"reward", 1}}, 409, "reward");
  expect_error("/v1/episodes/ep-5/reward", {{"reward", "high"}}, 400, "reward");
  auto e = book->take("ep-4");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->reward, 0.5);
  EXPECT_EQ(e->trajectories.at(0).reward, 0.5);
  // Serving beyond loopback needs TLS; a key is always needed.
  cluster::gateway_options open;
  open.key = key;
  open.listen = "0.0.0.0:0";
  EXPECT_FALSE(cluster::agent_gateway::start(sys, rollout, book, open));
  cluster::gateway_options keyless;
  EXPECT_FALSE(cluster::agent_gateway::start(sys, rollout, book, keyless));
}

// A job's book admits only its iteration's episodes, each for max_calls
// calls (NOTE [agent book]); an episode's base URL sets only its own reward.
TEST_F(AgentGateway, AnOpenedBookRefusesOtherEpisodesAndCallsPastTheBound) {
  book->open({"ep-a", "ep-b"}, 2);
  json body{{"prompt", "abc"}, {"max_tokens", 2}};
  auto status = [&](const std::string& path, const json& b) {
    auto r = post(path, b);
    EXPECT_TRUE(r) << path;
    return r ? r->status : 0;
  };
  EXPECT_EQ(status("/e/ep-z/v1/completions", body), 404);
  EXPECT_EQ(status("/v1/episodes/ep-z/reward", {{"reward", 1}}), 404);
  EXPECT_EQ(status("/e/ep-a/v1/completions", body), 200);
  EXPECT_EQ(status("/e/ep-a/v1/completions", body), 200);
  EXPECT_EQ(status("/e/ep-a/v1/completions", body), 429) << "the third call of two allowed";
  EXPECT_EQ(status("/e/ep-b/v1/completions", body), 200);
  EXPECT_EQ(status("/e/ep-a/v1/episodes/ep-b/reward", {{"reward", 1}}), 400);
  EXPECT_EQ(status("/e/ep-b/v1/episodes/ep-b/reward", {{"reward", 1}}), 200);
  EXPECT_TRUE(book->rewarded("ep-b"));
  EXPECT_FALSE(book->rewarded("ep-a"));
  auto a = book->take("ep-a");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->trajectories.size(), 2u) << "the same prompt twice: a rewritten history";
}
