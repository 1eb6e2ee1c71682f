// The remote reward (NOTE [remote reward]) against the Python reference
// server (examples/python/reward_server.py) as a real process on an
// ephemeral loopback port: scores in order, batching and concurrency limits,
// a killed server, a wrong token, a slow server, and a job scored by it.

#include "actors/actor_system.hpp"
#include "actors/rl/job.hpp"
#include "actors/rl/job_config.hpp"
#include "cluster/remote_reward.hpp"
#include "models/tokenizer.hpp"
#include "tests/actors/job_yaml.hpp"
#include "tests/support/process.hpp"
#include "tests/support/python_service.hpp"
#include "tests/support/temp_dir.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

using namespace troupe;
using namespace troupe::actors::rl;

namespace {

/// The reference reward server, started with `flags`.
class reward_server : public test::python_service {
public:
  reward_server(const test::temp_dir& dir, std::vector<std::string> flags)
      : python_service(dir, "reward_server.py", std::move(flags)) {}
};

remote_service_config config_for(const std::string& address) {
  remote_service_config c;
  c.address = address;
  c.timeout_s = 10;
  c.retries = 2;
  c.backoff_s = 0.05;
  return c;
}

reward_request request_of(const models::tokenizer& tok, const std::vector<std::string>& responses,
                          const std::vector<std::string>& answers) {
  reward_request r;
  for (size_t i = 0; i < responses.size(); ++i) {
    r.prompts.push_back(tok.encode("q" + std::to_string(i) + "="));
    auto ids = tok.encode(responses[i]);
    ids.push_back(*tok.eos_id());
    r.responses.push_back(ids);
    r.answers.push_back(answers[i]);
    r.metadata.push_back("{\"i\": " + std::to_string(i) + "}");
  }
  return r;
}

std::vector<float> values(const at::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

class RemoteReward : public ::testing::Test {
protected:
  void SetUp() override {
    if (auto why = test::python_grpc_missing(); !why.empty())
      GTEST_SKIP() << why;
  }
  test::temp_dir dir;
  std::shared_ptr<models::byte_tokenizer> tok = std::make_shared<models::byte_tokenizer>();
};

TEST_F(RemoteReward, ScoresArriveInOrderWithinTheBatchAndConcurrencyLimits) {
  reward_server server{dir, {"--report-load", "--delay", "0.05"}};
  std::string why;
  auto address = server.address(why);
  ASSERT_FALSE(address.empty()) << why;
  auto c = config_for(address);
  c.batch_size = 3;
  c.max_in_flight = 2;
  auto backend = cluster::make_remote_reward(c, tok, "test-job");
  ASSERT_TRUE(backend) << describe(backend.error());
  // 10 samples: right, wrong, right, ... with GSM8K answers.
  std::vector<std::string> responses, answers;
  std::vector<float> want;
  for (int i = 0; i < 10; ++i) {
    bool right = i % 3 != 1;
    responses.push_back("so #### " + std::to_string(right ? i * 11 : i * 11 + 1));
    answers.push_back(std::to_string(i * 11));
    want.push_back(right ? 1.f : 0.f);
  }
  auto s = (*backend)->score(request_of(*tok, responses, answers));
  ASSERT_TRUE(s) << describe(s.error());
  EXPECT_EQ(values(*s), want);
  auto extras = (*backend)->extras();
  auto batch = values(*extras.get("extra/batch_size"));
  auto in_flight = values(*extras.get("extra/in_flight"));
  EXPECT_EQ(*std::max_element(batch.begin(), batch.end()), 3.f) << "calls of batch_size";
  EXPECT_EQ(batch.back(), 1.f) << "10 = 3 + 3 + 3 + 1";
  EXPECT_LE(*std::max_element(in_flight.begin(), in_flight.end()), 2.f) << "max_in_flight";
}

TEST_F(RemoteReward, AWrongTokenIsRefusedWithoutRetries) {
  auto token = dir.write("token", "s3cret\n");
  reward_server server{dir, {"--token-file", token}};
  std::string why;
  auto address = server.address(why);
  ASSERT_FALSE(address.empty()) << why;
  auto c = config_for(address);
  c.token_file = dir.write("wrong", "guess");
  auto backend = cluster::make_remote_reward(c, tok, "test-job");
  ASSERT_TRUE(backend);
  auto s = (*backend)->score(request_of(*tok, {"#### 1"}, {"1"}));
  ASSERT_FALSE(s);
  auto msg = describe(s.error());
  EXPECT_NE(msg.find("UNAUTHENTICATED"), std::string::npos) << msg;
  EXPECT_NE(msg.find("after 1 attempt"), std::string::npos) << msg;
  c.token_file = token;
  auto right = cluster::make_remote_reward(c, tok, "test-job");
  auto ok = (*right)->score(request_of(*tok, {"#### 1"}, {"1"}));
  ASSERT_TRUE(ok) << describe(ok.error());
  EXPECT_EQ(values(*ok), std::vector<float>{1.f});
}

TEST_F(RemoteReward, AKilledServerFailsClearlyAfterTheRetries) {
  reward_server server{dir, {}};
  std::string why;
  auto address = server.address(why);
  ASSERT_FALSE(address.empty()) << why;
  auto backend = cluster::make_remote_reward(config_for(address), tok, "test-job");
  ASSERT_TRUE(backend);
  ASSERT_TRUE((*backend)->score(request_of(*tok, {"#### 2"}, {"2"})));
  server.kill();
  auto start = std::chrono::steady_clock::now();
  auto s = (*backend)->score(request_of(*tok, {"#### 2"}, {"2"}));
  ASSERT_FALSE(s);
  auto msg = describe(s.error());
  EXPECT_EQ(code_of(s.error()), errc::unavailable) << msg;
  EXPECT_NE(msg.find("reward service " + address + ": call 1 of 1 (1 samples): UNAVAILABLE"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("after 3 attempts"), std::string::npos) << msg;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST_F(RemoteReward, ASlowServerTimesOut) {
  reward_server server{dir, {"--delay", "5"}};
  std::string why;
  auto address = server.address(why);
  ASSERT_FALSE(address.empty()) << why;
  auto c = config_for(address);
  c.timeout_s = 0.3;
  c.retries = 1;
  auto backend = cluster::make_remote_reward(c, tok, "test-job");
  auto s = (*backend)->score(request_of(*tok, {"#### 2"}, {"2"}));
  ASSERT_FALSE(s);
  EXPECT_EQ(code_of(s.error()), errc::timeout);
  EXPECT_NE(describe(s.error()).find("DEADLINE_EXCEEDED"), std::string::npos)
      << describe(s.error());
  EXPECT_NE(describe(s.error()).find("after 2 attempts"), std::string::npos);
}

TEST_F(RemoteReward, ClearTextBeyondLoopbackIsRefused) {
  auto backend = cluster::make_remote_reward(config_for("192.0.2.7:5000"), tok, "test-job");
  ASSERT_FALSE(backend);
  EXPECT_NE(describe(backend.error()).find("is not loopback"), std::string::npos)
      << describe(backend.error());
}

// A job whose reward is the service: extras land in metrics.jsonl, scoring
// overlaps generation, and a server killed mid-job ends it naming the phase.
TEST_F(RemoteReward, AJobIsScoredByTheServiceAndFailsClearlyWithoutIt) {
  reward_server server{dir, {"--report-load", "--extract", "flexible"}};
  std::string why;
  auto address = server.address(why);
  ASSERT_FALSE(address.empty()) << why;
  auto yaml = troupe::actors::rl::testing::tiny_job(
      dir.file("run"), "  reward:\n    kind: remote\n    remote: {address: '" + address +
                           "', batch_size: 4, retries: 1, backoff_s: 0.05}\n");
  auto cfg = troupe::actors::rl::testing::parse_job(yaml, {"stages=[sft, rl]", "rl.iterations=2"});
  ASSERT_TRUE(cfg) << describe(cfg.error());
  run_options opts;
  opts.factories = cluster::process_factories();
  {
    caf::actor_system_config sc;
    actors::configure(sc);
    caf::actor_system sys{sc};
    auto summary = run_job(sys, *cfg, opts);
    ASSERT_TRUE(summary) << describe(summary.error());
  }
  std::ifstream in(std::filesystem::path{cfg->run.dir} / "metrics.jsonl");
  std::string line;
  int scored = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["stage"] != "rl" || !j.contains("critic/remote_score/mean"))
      continue;
    ++scored;
    EXPECT_LE(j["reward/extra/batch_size"].get<double>(), 4.0);
    EXPECT_TRUE(j.contains("timing_s/reward_hidden")) << "scored while generating";
  }
  EXPECT_EQ(scored, 2);

  server.kill();
  auto again = troupe::actors::rl::testing::parse_job(
      yaml, {"stages=[sft, rl]", "rl.iterations=1", "run.dir=" + dir.file("run2")});
  ASSERT_TRUE(again);
  caf::actor_system_config sc;
  actors::configure(sc);
  caf::actor_system sys{sc};
  auto failed = run_job(sys, *again, opts);
  ASSERT_FALSE(failed);
  auto msg = describe(failed.error());
  EXPECT_NE(msg.find("phase reward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("reward service " + address), std::string::npos) << msg;
  EXPECT_NE(msg.find("after 2 attempts"), std::string::npos) << msg;
}

} // namespace
