// NOTE [episodes]: multi-turn rollouts of a real rollout actor against
// in-process environments — the tokens are the model's turns and the
// rendered observations, the log-probs those of the whole sequence, the
// masks exactly the model's tokens — and the errors of an environment that
// hangs, throws or answers garbage.

#include "actors/actor_system.hpp"
#include "actors/inference/rollout.hpp"
#include "actors/rl/environment.hpp"
#include "actors/rl/episodes.hpp"
#include "models/llama.hpp"
#include "models/tokenizer.hpp"
#include "tests/actors/call_tokenizer.hpp"
#include "tests/actors/tiny_engine.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <mutex>
#include <set>
#include <thread>

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::actors::rl;
using troupe::test::call_tokenizer;
using troupe::test::episode_model;

namespace {

// What a test environment saw and does.
struct scripted_env final : environment {
  std::string name() const override { return "scripted"; }
  expected<std::vector<reset_result>> reset(const std::vector<reset_task>& tasks) override {
    std::vector<reset_result> out;
    for (const auto& t : tasks) {
      reset_result r{t.session, {}, nlohmann::ordered_json::array({calculator_tool()})};
      r.first.text = "q:" + t.row.prompt;
      out.push_back(r);
    }
    return out;
  }
  expected<std::vector<step_result>> step(const std::vector<env_turn>& turns) override {
    std::vector<step_result> out;
    for (const auto& t : turns) {
      {
        std::lock_guard lock{mu};
        seen.push_back(t);
      }
      if (hang_at_turn == t.turn)
        std::this_thread::sleep_for(std::chrono::seconds(30));
      if (throw_at_turn == t.turn)
        throw std::runtime_error("the environment fell over");
      step_result r;
      r.session = t.session;
      r.done = t.turn >= done_at_turn;
      r.reward = r.done ? 1.0 + t.turn : 0.25; // shaping before the end
      r.info["turn_seen"] = 1;
      if (!r.done)
        r.next.text = "obs" + std::to_string(t.turn) + "|";
      if (garbage)
        r.reward = std::numeric_limits<double>::infinity();
      out.push_back(r);
    }
    return out;
  }
  void close(const std::vector<std::string>& sessions, std::string_view reason) override {
    std::lock_guard lock{mu};
    for (const auto& s : sessions)
      closed.emplace_back(s, std::string{reason});
  }

  std::mutex mu;
  std::vector<env_turn> seen;
  std::vector<std::pair<std::string, std::string>> closed;
  int done_at_turn = 3;
  int hang_at_turn = 0;
  int throw_at_turn = 0;
  bool garbage = false;
};

struct episodes_fixture : ::testing::Test {
  episodes_fixture() : sys{(actors::configure(cfg), cfg)} { rollout = spawn(); }

  /// A rollout of the model (stop it with anon_send_exit).
  inference::rollout_actor spawn() {
    inference::engine_config c;
    c.num_blocks = 256;
    c.block_size = 4;
    c.max_num_seqs = 16;
    auto r = inference::spawn_rollout(sys, model, c);
    EXPECT_TRUE(r) << describe(r.error());
    return r ? *r : inference::rollout_actor{};
  }
  ~episodes_fixture() override { caf::anon_send_exit(rollout, caf::exit_reason::user_shutdown); }

  std::vector<episode_prompt> prompts(int count, int n, int64_t max_tokens) {
    std::vector<episode_prompt> out;
    for (int i = 0; i < count; ++i) {
      episode_prompt p;
      p.id = "0/" + std::to_string(i);
      p.row.prompt = std::string(static_cast<size_t>(2 + i), static_cast<char>('a' + i));
      p.row.answer = "x";
      p.sampling.temperature = 1.0;
      p.sampling.max_tokens = max_tokens;
      p.sampling.n = n;
      p.sampling.seed = 100 + static_cast<uint64_t>(i);
      // A random model seldom samples EOS: the odd ids end its turns too
      // (the tool calls' aside).
      for (int64_t t = 3; t < 50; t += 2)
        if (t != call_tokenizer::valid_call && t != call_tokenizer::unknown_tool)
          p.sampling.stop_token_ids.push_back(t);
      out.push_back(p);
    }
    return out;
  }

  expected<episode_batch> run(std::shared_ptr<environment> env,
                              const std::vector<episode_prompt>& ps, episode_options o = {}) {
    if (o.max_context == 512)
      o.max_context = 200;
    return run_episodes(sys, rollout, std::move(env), enc, ps, o);
  }

  caf::actor_system_config cfg;
  caf::actor_system sys;
  models::llama_model model = episode_model();
  std::shared_ptr<call_tokenizer> tok = std::make_shared<call_tokenizer>();
  prompt_encoder enc{tok, false};
  inference::rollout_actor rollout;
};

} // namespace

namespace {

// The text an observation's messages become for a model without a chat
// template (NOTE [observation tokens]).
std::string plain(const nlohmann::ordered_json& m) {
  auto content = m.value("content", "");
  return m.value("role", "") == "tool" ? "<tool_response>" + content + "</tool_response>\n"
                                       : content;
}

} // namespace

TEST_F(episodes_fixture, TokensAreTheModelsTurnsAndTheObservationsRenderedOnce) {
  auto env = std::make_shared<scripted_env>();
  episode_options o;
  o.max_turns = 4;
  auto got = run(env, prompts(6, 2, 6), o);
  ASSERT_TRUE(got) << describe(got.error());
  ASSERT_EQ(got->episodes.size(), 12u);
  int multi_turn = 0, tool_errors = 0;
  for (const auto& ep : got->episodes) {
    SCOPED_TRACE(ep.session);
    const auto n = ep.tokens.size();
    ASSERT_EQ(ep.loss_mask.size(), n);
    ASSERT_EQ(ep.logprobs.size(), n);
    ASSERT_EQ(ep.versions.size(), n);
    // The first prompt: the first observation as a plain prompt (BOS + text).
    auto i = static_cast<size_t>(std::stoi(ep.session.substr(2)));
    EXPECT_EQ(ep.prompt,
              encode_prompt(*tok, "q:" + std::string(2 + i, static_cast<char>('a' + i))));
    // The masked spans are exactly the observations, in order, each the
    // tokens of its rendering (tokenised once, never re-tokenised).
    std::vector<std::string> observations;
    std::string current;
    int last_turn = 0;
    for (const auto& m : ep.transcript) {
      if (!m.contains("turn") || m.value("role", "") == "assistant")
        continue;
      if (m["turn"].get<int>() != last_turn && !current.empty())
        observations.push_back(std::exchange(current, ""));
      last_turn = m["turn"].get<int>();
      current += plain(m);
    }
    if (!current.empty())
      observations.push_back(current);
    std::vector<std::vector<int64_t>> spans;
    for (size_t j = 0; j < n; ++j)
      if (ep.loss_mask[j] == 0.0f) {
        if (j == 0 || ep.loss_mask[j - 1] != 0.0f)
          spans.emplace_back();
        spans.back().push_back(ep.tokens[j]);
      }
    ASSERT_EQ(spans.size(), observations.size());
    for (size_t k = 0; k < spans.size(); ++k)
      EXPECT_EQ(spans[k], tok->encode(observations[k])) << "observation " << k;
    EXPECT_EQ(static_cast<int64_t>(std::count(ep.loss_mask.begin(), ep.loss_mask.end(), 0.0f)),
              ep.observation_tokens);
    // Each model turn before an observation ended with EOS or a stop token.
    for (size_t j = 1; j < n; ++j)
      if (ep.loss_mask[j] == 0.0f && ep.loss_mask[j - 1] == 1.0f) {
        EXPECT_TRUE(ep.tokens[j - 1] == 2 || ep.tokens[j - 1] % 2 == 1) << "token " << j;
      }
    // The model's tokens were sampled after exactly this sequence: their
    // log-probs are the whole sequence's, by a forward of it.
    auto forced = test::teacher_forced(model, ep.prompt, ep.tokens);
    for (size_t j = 0; j < n; ++j) {
      if (ep.loss_mask[j] == 1.0f)
        EXPECT_NEAR(ep.logprobs[j], forced[j], 2e-4) << "token " << j;
      else
        EXPECT_EQ(ep.logprobs[j], 0.0f);
    }
    EXPECT_LE(ep.turns, 4);
    EXPECT_EQ(ep.end == episode_end::done, ep.reward != 0.0);
    if (ep.end == episode_end::done) {
      EXPECT_EQ(ep.reward, 4.0); // the scripted environment ends at turn 3
    }
    multi_turn += ep.turns > 1;
    tool_errors += ep.tool_errors;
    // Shaping (0.25 per stepped turn that did not end) at the turn's last token.
    if (!ep.shaping.empty())
      for (size_t j = 0; j < ep.shaping.size(); ++j)
        if (ep.shaping[j] != 0.0f) {
          EXPECT_EQ(ep.shaping[j], 0.25f);
          EXPECT_EQ(ep.loss_mask[j], 1.0f);
          EXPECT_TRUE(j + 1 == n || ep.loss_mask[j + 1] == 0.0f);
        }
  }
  EXPECT_GT(multi_turn, 3) << "the seeds give several multi-turn episodes";
  // NOTE [tool calls]: a malformed call or one of an unknown tool goes back
  // to the model; the environment never sees it. A valid call reaches it
  // read and checked.
  std::lock_guard lock{env->mu};
  int valid = 0;
  for (const auto& t : env->seen) {
    EXPECT_EQ(t.text.find("{oops"), std::string::npos);
    EXPECT_EQ(t.text.find("\"search\""), std::string::npos);
    for (const auto& c : t.calls) {
      EXPECT_EQ(c.name, "calculator");
      EXPECT_EQ(nlohmann::json::parse(c.arguments_json)["expression"], "12345678901234567890 * 3");
      ++valid;
    }
  }
  EXPECT_GT(valid + tool_errors, 0) << "the seeds write some tool calls";
  auto m = episode_metrics(*got);
  EXPECT_EQ(m["env/episodes"], 12);
  EXPECT_GT(m["env/turns/mean"], 1.0);
  EXPECT_GT(m["env/observation_tokens/mean"], 0.0);
  EXPECT_GE(m["env/step_latency_ms/p99"], m["env/step_latency_ms/p50"]);
  EXPECT_NEAR(m["env/finish/done"] + m["env/finish/max_turns"] + m["env/finish/length"] +
                  m["env/finish/context"],
              1.0, 1e-9);
}

TEST_F(episodes_fixture, ASingleTurnTaskSamplesWhatTheBatchPathSamples) {
  rule_config exact;
  exact.kind = rule_kind::exact;
  auto rules = rule_set::make({exact}, 5);
  ASSERT_TRUE(rules) << describe(rules.error());
  auto ps = prompts(3, 2, 5);
  auto got = run(std::shared_ptr<environment>{make_task_environment(*rules)}, ps);
  ASSERT_TRUE(got) << describe(got.error());
  // The same requests to a second rollout of the same model.
  auto other = spawn();
  std::vector<inference::generate_request> reqs;
  for (const auto& p : ps)
    reqs.push_back({p.id, encode_prompt(*tok, p.row.prompt), p.sampling, ""});
  caf::scoped_actor self{sys};
  std::vector<inference::request_output> outs;
  self->request(other, std::chrono::seconds(60), inference::generate_atom::value, reqs)
      .receive([&](inference::generation& g) { outs = std::move(g.outputs); },
               [&](caf::error& e) { FAIL() << describe(e); });
  caf::anon_send_exit(other, caf::exit_reason::user_shutdown);
  ASSERT_EQ(outs.size(), 3u);
  for (size_t i = 0; i < 6; ++i) {
    const auto& ep = got->episodes[i];
    const auto& s = outs[i / 2].samples[i % 2];
    EXPECT_EQ(ep.prompt, outs[i / 2].prompt);
    EXPECT_EQ(ep.tokens, s.tokens);
    EXPECT_EQ(ep.logprobs, s.logprobs);
    EXPECT_EQ(ep.turns, 1);
    EXPECT_EQ(ep.end, episode_end::done);
    EXPECT_EQ(ep.observation_tokens, 0);
    EXPECT_TRUE(
        std::all_of(ep.loss_mask.begin(), ep.loss_mask.end(), [](float x) { return x == 1; }));
  }
}

TEST_F(episodes_fixture, AHangingEnvironmentIsNamedWithItsSessionAndPhase) {
  auto env = std::make_shared<scripted_env>();
  env->hang_at_turn = 1;
  episode_options o;
  o.timeout_s = 0.3;
  auto t0 = std::chrono::steady_clock::now();
  auto got = run(env, prompts(2, 1, 4), o);
  ASSERT_FALSE(got);
  auto msg = describe(got.error());
  EXPECT_NE(msg.find("environment 'scripted': session 0/"), std::string::npos) << msg;
  EXPECT_NE(msg.find("step (turn 1)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no answer within"), std::string::npos) << msg;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  std::lock_guard lock{env->mu};
  int errors = 0;
  for (const auto& [s, why] : env->closed)
    errors += why == "error";
  EXPECT_GT(errors, 0) << "the hanging sessions are closed";
}

TEST_F(episodes_fixture, AThrowingOrGarbageEnvironmentFailsTheRunByName) {
  auto thrower = std::make_shared<scripted_env>();
  thrower->throw_at_turn = 1;
  auto got = run(thrower, prompts(2, 1, 4));
  ASSERT_FALSE(got);
  EXPECT_NE(describe(got.error()).find("step (turn 1): threw: the environment fell over"),
            std::string::npos)
      << describe(got.error());
  auto garbage = std::make_shared<scripted_env>();
  garbage->garbage = true;
  got = run(garbage, prompts(2, 1, 4));
  ASSERT_FALSE(got);
  EXPECT_NE(describe(got.error()).find("a reward that is not a finite fp32 number"),
            std::string::npos)
      << describe(got.error());
}

TEST_F(episodes_fixture, TurnAndContextLimitsEndEpisodesWithTheirReasons) {
  auto env = std::make_shared<scripted_env>();
  env->done_at_turn = 100;
  episode_options o;
  o.max_turns = 2;
  auto got = run(env, prompts(4, 2, 4), o);
  ASSERT_TRUE(got) << describe(got.error());
  for (const auto& ep : got->episodes) {
    EXPECT_LE(ep.turns, 2);
    EXPECT_TRUE(ep.end == episode_end::max_turns || ep.end == episode_end::length) << ep.session;
  }
  o.max_turns = 50;
  o.max_context = 40;
  got = run(env, prompts(4, 2, 4), o);
  ASSERT_TRUE(got) << describe(got.error());
  int by_context = 0;
  for (const auto& ep : got->episodes) {
    EXPECT_LT(ep.prompt.size() + ep.tokens.size(), 40u);
    by_context += ep.end == episode_end::context;
  }
  EXPECT_GT(by_context, 0);
  std::lock_guard lock{env->mu};
  std::set<std::string> reasons;
  for (const auto& [s, why] : env->closed)
    reasons.insert(why);
  EXPECT_TRUE(reasons.count("max_turns") && reasons.count("context"));
}

TEST_F(episodes_fixture, LockstepEpisodesAreTheSameInEveryRun) {
  episode_options o;
  o.max_turns = 4;
  o.overlap = false;
  auto first = run(std::make_shared<scripted_env>(), prompts(4, 2, 6), o);
  ASSERT_TRUE(first) << describe(first.error());
  // A fresh rollout: the same batches, so the same tokens and log-probs.
  auto other = spawn();
  auto again =
      run_episodes(sys, other, std::make_shared<scripted_env>(), enc, prompts(4, 2, 6), [&] {
        auto p = o;
        p.max_context = 200;
        return p;
      }());
  caf::anon_send_exit(other, caf::exit_reason::user_shutdown);
  ASSERT_TRUE(again) << describe(again.error());
  ASSERT_EQ(first->episodes.size(), again->episodes.size());
  int turns = 0;
  for (size_t i = 0; i < first->episodes.size(); ++i) {
    EXPECT_EQ(first->episodes[i].tokens, again->episodes[i].tokens) << i;
    EXPECT_EQ(first->episodes[i].logprobs, again->episodes[i].logprobs) << i;
    EXPECT_EQ(first->episodes[i].loss_mask, again->episodes[i].loss_mask) << i;
    turns += first->episodes[i].turns;
  }
  EXPECT_GT(turns, 8) << "multi-turn episodes";
}

TEST(Calculator, EvaluatesIntegerExpressionsExactly) {
  EXPECT_EQ(evaluate_integer_expression("12345678901234567890 * 3").value(),
            "37037036703703703670");
  EXPECT_EQ(evaluate_integer_expression("99999999999999999999 + 1").value(),
            "100000000000000000000");
  EXPECT_EQ(evaluate_integer_expression("-(2 - 5) * (4 + -6)").value(), "-6");
  EXPECT_EQ(evaluate_integer_expression("0 * -7").value(), "0");
  EXPECT_EQ(evaluate_integer_expression("1000 - 1000").value(), "0");
  for (const char* bad : {"", "2 +", "(1", "1 / 2", "1e3",
                          "((((((((((((((((((((((((((((((((((((((("
                          "((((((((((((((((((((((((((((1"}) {
    auto r = evaluate_integer_expression(bad);
    EXPECT_FALSE(r) << bad;
    if (!r) {
      EXPECT_NE(describe(r.error()).find("expression: byte"), std::string::npos)
          << describe(r.error());
    }
  }
  EXPECT_FALSE(evaluate_integer_expression(std::string(5000, '1')));
}

TEST(Calculator, AnswersCallsAndScoresTheAnswer) {
  rule_config exact;
  exact.kind = rule_kind::exact;
  auto rules = rule_set::make({exact}, 16);
  ASSERT_TRUE(rules);
  auto env = make_calculator_environment(*rules);
  example row{"add:48213+99731=", "147944", "", ""};
  auto opened = env->reset({{"s", row}});
  ASSERT_TRUE(opened);
  ASSERT_EQ(opened->size(), 1u);
  EXPECT_EQ((*opened)[0].first.text, row.prompt);
  EXPECT_EQ((*opened)[0].tools[0]["function"]["name"], "calculator");
  env_turn call{"s",    1, "", "", {{"call_1_1", "calculator", R"({"expression": "48213+99731"})"}},
                "stop", 10};
  auto r = env->step({call});
  ASSERT_TRUE(r);
  EXPECT_FALSE((*r)[0].done);
  ASSERT_EQ((*r)[0].next.messages.size(), 1u);
  EXPECT_EQ((*r)[0].next.messages[0].content, "147944");
  EXPECT_EQ((*r)[0].next.messages[0].tool_call_id, "call_1_1");
  env_turn answer{"s", 2, "147944", "147944", {}, "stop", 6};
  r = env->step({answer});
  ASSERT_TRUE(r);
  EXPECT_TRUE((*r)[0].done);
  EXPECT_EQ((*r)[0].reward, 1.0);
  EXPECT_FALSE(env->step({answer})) << "the session ended";
}
