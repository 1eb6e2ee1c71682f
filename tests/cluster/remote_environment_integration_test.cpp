// The remote environment (NOTE [remote environment]) against the Python
// reference server (examples/python/tool_env_server.py) as a real process
// on an ephemeral loopback port: episodes whose tool calls the server
// answers, and a server that hangs, crashes, answers garbage or wants a
// token — each an error naming the environment, the session and the phase.

#include "actors/actor_system.hpp"
#include "actors/inference/rollout.hpp"
#include "actors/rl/episodes.hpp"
#include "actors/rl/job_config.hpp"
#include "cluster/remote_environment.hpp"
#include "tests/actors/call_tokenizer.hpp"
#include "tests/support/python_service.hpp"
#include "tests/support/temp_dir.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>

#include <fstream>

using namespace troupe;
using namespace troupe::actors::rl;
using troupe::test::call_tokenizer;

namespace {

class env_server : public test::python_service {
public:
  env_server(const test::temp_dir& dir, std::vector<std::string> flags)
      : python_service(dir, "tool_env_server.py", std::move(flags)) {}
};

class RemoteEnvironment : public ::testing::Test {
protected:
  RemoteEnvironment() : sys{(actors::configure(cfg), cfg)} {}
  void SetUp() override {
    if (auto why = test::python_grpc_missing(); !why.empty())
      GTEST_SKIP() << why;
    actors::inference::engine_config c;
    c.num_blocks = 256;
    c.block_size = 4;
    auto r = actors::inference::spawn_rollout(sys, test::episode_model(), c);
    ASSERT_TRUE(r) << describe(r.error());
    rollout = *r;
  }
  void TearDown() override {
    if (rollout)
      caf::anon_send_exit(rollout, caf::exit_reason::user_shutdown);
  }

  remote_service_config config_for(const std::string& address) {
    remote_service_config c;
    c.address = address;
    c.timeout_s = 5;
    c.retries = 1;
    c.backoff_s = 0.05;
    c.batch_size = 3;
    return c;
  }

  std::vector<episode_prompt> prompts(int count) {
    std::vector<episode_prompt> out;
    for (int i = 0; i < count; ++i) {
      episode_prompt p;
      p.id = "0/" + std::to_string(i);
      p.row = {"add:" + std::to_string(i) + "+1=", std::to_string(i + 1), "", ""};
      p.sampling.max_tokens = 6;
      p.sampling.n = 2;
      p.sampling.seed = 200 + static_cast<uint64_t>(i);
      for (int64_t t = 3; t < 50; t += 2)
        if (t != call_tokenizer::valid_call && t != call_tokenizer::unknown_tool)
          p.sampling.stop_token_ids.push_back(t);
      out.push_back(p);
    }
    return out;
  }

  expected<episode_batch> run(const remote_service_config& c, double timeout_s = 10) {
    auto env = cluster::make_remote_environment(c, "test-job");
    if (!env)
      return env.error();
    episode_options o;
    o.max_turns = 4;
    o.max_context = 200;
    o.timeout_s = timeout_s;
    return run_episodes(sys, rollout, std::shared_ptr<environment>{std::move(*env)}, enc,
                        prompts(4), o);
  }

  test::temp_dir dir;
  caf::actor_system_config cfg;
  caf::actor_system sys;
  std::shared_ptr<call_tokenizer> tok = std::make_shared<call_tokenizer>();
  prompt_encoder enc{tok, false};
  actors::inference::rollout_actor rollout;
};

} // namespace

TEST_F(RemoteEnvironment, RunsEpisodesWhoseToolCallsTheServerAnswers) {
  env_server server{dir, {}};
  std::string why;
  auto address = server.address(why);
  ASSERT_FALSE(address.empty()) << why;
  auto got = run(config_for(address));
  ASSERT_TRUE(got) << describe(got.error()) << "\n" << server.log();
  ASSERT_EQ(got->episodes.size(), 8u);
  // The server's calculator answered the model's valid call: its result is
  // in the episode, as the plain rendering of a tool message, unmasked by
  // nothing (an observation: loss mask 0).
  const auto result = tok->encode("<tool_response>37037036703703703670</tool_response>\n");
  int answered = 0;
  for (const auto& ep : got->episodes) {
    EXPECT_EQ(ep.prompt, encode_prompt(*tok, "add:" + ep.session.substr(2, 1) + "+1="));
    for (size_t j = 0; j + result.size() <= ep.tokens.size(); ++j)
      if (std::equal(result.begin(), result.end(), ep.tokens.begin() + static_cast<long>(j))) {
        ++answered;
        for (size_t k = 0; k < result.size(); ++k)
          EXPECT_EQ(ep.loss_mask[j + k], 0.0f);
      }
    if (ep.end == episode_end::done) {
      EXPECT_TRUE(ep.reward == 0.0 || ep.reward == 1.0);
    }
  }
  EXPECT_GT(answered, 0) << "the seeds make the model call the calculator";
  auto m = episode_metrics(*got);
  EXPECT_GT(m["env/tool_call_rate"], 0.0);
  EXPECT_GT(m["env/step_latency_ms/p50"], 0.0);
}

TEST_F(RemoteEnvironment, AHangingServerIsAnErrorNamingTheSessionAndPhase) {
  env_server server{dir, {"--hang-at-turn", "1"}};
  std::string why;
  auto address = server.address(why);
  ASSERT_FALSE(address.empty()) << why;
  auto c = config_for(address);
  c.timeout_s = 0.5;
  c.retries = 0;
  auto got = run(c);
  ASSERT_FALSE(got);
  auto msg = describe(got.error());
  EXPECT_NE(msg.find("environment 'remote " + address + "': session 0/"), std::string::npos) << msg;
  EXPECT_NE(msg.find("step (turn 1)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("DEADLINE_EXCEEDED"), std::string::npos) << msg;
}

TEST_F(RemoteEnvironment, ACrashedServerIsAnErrorAfterItsRetries) {
  env_server server{dir, {"--crash-at-turn", "1"}};
  std::string why;
  auto address = server.address(why);
  ASSERT_FALSE(address.empty()) << why;
  auto got = run(config_for(address));
  ASSERT_FALSE(got);
  auto msg = describe(got.error());
  EXPECT_NE(msg.find("step (turn 1)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("UNAVAILABLE"), std::string::npos) << msg;
  EXPECT_NE(msg.find("after 2 attempts"), std::string::npos) << msg;
}

TEST_F(RemoteEnvironment, GarbageAndAMissingTokenAreRefused) {
  {
    env_server server{dir, {"--garbage"}};
    std::string why;
    auto address = server.address(why);
    ASSERT_FALSE(address.empty()) << why;
    auto got = run(config_for(address));
    ASSERT_FALSE(got);
    EXPECT_NE(describe(got.error()).find("a reward that is not a finite fp32 number"),
              std::string::npos)
        << describe(got.error());
  }
  auto token = dir.file("token");
  std::ofstream(token) << "s3cret\n";
  env_server server{dir, {"--token-file", token}};
  std::string why;
  auto address = server.address(why);
  ASSERT_FALSE(address.empty()) << why;
  auto got = run(config_for(address));
  ASSERT_FALSE(got);
  auto msg = describe(got.error());
  EXPECT_NE(msg.find("reset"), std::string::npos) << msg;
  EXPECT_NE(msg.find("UNAUTHENTICATED"), std::string::npos) << msg;
  auto c = config_for(address);
  c.token_file = token;
  got = run(c);
  EXPECT_TRUE(got) << describe(got.error());
}
