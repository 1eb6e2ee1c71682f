// A job whose rollout is agent code (NOTE [agent runs]): the driver starts
// tests/cluster/agent_job_client.py — Python's urllib against the
// OpenAI-compatible endpoint, as a real process — once per iteration; the
// trainer trains on the exact tokens and log-probs the engine served it.
// An agent that posts no reward, hangs, fails or skips an episode fails the
// iteration naming the episodes.

#include "actors/actor_system.hpp"
#include "actors/rl/job.hpp"
#include "cluster/agent_host.hpp"
#include "cluster/remote_reward.hpp"
#include "tests/actors/job_yaml.hpp"
#include "tests/support/temp_dir.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

using namespace troupe;
using namespace troupe::actors::rl;
using json = nlohmann::json;

namespace {

std::vector<json> lines_of(const std::string& path) {
  std::vector<json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty())
      out.push_back(json::parse(line));
  return out;
}

std::vector<json> rl_metrics(const std::string& run_dir) {
  std::vector<json> out;
  for (auto& j : lines_of((std::filesystem::path{run_dir} / "metrics.jsonl").string()))
    if (j.value("stage", "") == "rl")
      out.push_back(std::move(j));
  return out;
}

class AgentJob : public ::testing::Test {
protected:
  // The tiny job (GRPO, 4 prompts × 2 samples) with the test agent and
  // `flags`, plus `sets`.
  expected<job_config> job(const std::string& name, const std::vector<std::string>& flags,
                           std::vector<std::string> sets = {}) {
    std::string argv = "['/usr/bin/python3', '" + std::string{TROUPE_SOURCE_DIR} +
                       "/tests/cluster/agent_job_client.py', '--record', '" + record() + "'";
    for (const auto& f : flags)
      argv += ", '" + f + "'";
    argv += "]";
    sets.insert(sets.begin(), {"stages=[rl]", "rl.iterations=1", "rl.eval_every=0",
                               "model.max_position_embeddings=64", "rl.agent.command=" + argv});
    return troupe::actors::rl::testing::parse_job(
        troupe::actors::rl::testing::tiny_job(tmp.file(name),
                                              "  algorithm: grpo\n  samples_per_prompt: 2\n"),
        sets);
  }
  std::string record() const { return tmp.file("record.jsonl"); }
  // What the agent printed (for a failure's message).
  static std::string agent_log(const job_config& cfg) {
    std::ifstream in(std::filesystem::path{cfg.run.dir} / "agent" / "agent.log");
    return std::string{std::istreambuf_iterator<char>(in), {}};
  }

  expected<job_summary> run(const job_config& cfg) {
    caf::actor_system_config sc;
    actors::configure(sc);
    caf::actor_system sys{sc};
    run_options opts;
    opts.factories = cluster::process_factories();
    return run_job(sys, cfg, opts);
  }

  // The error of a job expected to fail.
  std::string failure(const std::string& name, const std::vector<std::string>& flags,
                      const std::vector<std::string>& sets = {}) {
    auto cfg = job(name, flags, sets);
    EXPECT_TRUE(cfg) << describe(cfg.error());
    if (!cfg)
      return "";
    auto r = run(*cfg);
    EXPECT_FALSE(r) << name << " should fail";
    return r ? "" : describe(r.error()) + "\n" + agent_log(*cfg);
  }

  test::temp_dir tmp;
};

} // namespace

TEST_F(AgentJob, TheTrainerTrainsOnWhatTheEngineServedTheAgent) {
  auto cfg = job("run", {"--by-header", "--rewrite-first"}, {"rl.iterations=2"});
  ASSERT_TRUE(cfg) << describe(cfg.error());
  auto r = run(*cfg);
  ASSERT_TRUE(r) << describe(r.error()) << "\n" << agent_log(*cfg);

  auto records = lines_of(record());
  ASSERT_EQ(records.size(), 16u) << "8 episodes in each of 2 iterations";
  auto lines = rl_metrics(cfg->run.dir);
  ASSERT_EQ(lines.size(), 3u); // steps 0, 1, 2
  for (size_t it = 1; it <= 2; ++it) {
    const auto& m = lines[it];
    // What the agent was answered, per episode of this iteration (the last
    // trajectory's completions), against what the batch was made of.
    double generated = 0, reward = 0, calls = 0;
    for (size_t e = 0; e < 8; ++e) {
      const auto& rec = records[(it - 1) * 8 + e];
      EXPECT_EQ(rec["episode"],
                std::to_string(it - 1) + "." + std::to_string(e / 2) + "." + std::to_string(e % 2));
      generated += static_cast<double>(rec["logprobs"].size());
      reward += rec["reward"].get<double>();
      calls += rec["calls"].get<double>();
    }
    EXPECT_EQ(m["env/episodes"].get<double>(), 8.0);
    EXPECT_DOUBLE_EQ(m["env/generated_tokens/mean"].get<double>(), generated / 8)
        << "the loss mask covers exactly the tokens the engine generated";
    EXPECT_DOUBLE_EQ(m["env/turns/mean"].get<double>(), calls / 8);
    EXPECT_DOUBLE_EQ(m["env/reward/mean"].get<double>(), reward / 8);
    EXPECT_DOUBLE_EQ(m["critic/env_score/mean"].get<double>(), reward / 8);
    EXPECT_EQ(m["agent/history_rewrites"].get<double>(), 1.0) << "the first episode's rewrite";
    EXPECT_DOUBLE_EQ(m["agent/trajectories/mean"].get<double>(), 9.0 / 8);
    EXPECT_GT(m["env/observation_tokens/mean"].get<double>(), 0.0);
    EXPECT_GT(m["actor/grad_norm"].get<double>(), 0.0) << "the policy trained on them";
  }
  // The first iteration's batch is scored by the weights that served it:
  // the trainer's log-probs of those tokens are the engine's.
  EXPECT_LT(lines[1]["rollout_corr/logprob_abs_diff_max"].get<double>(), 1e-3);

  auto tasks = lines_of((std::filesystem::path{cfg->run.dir} / "agent" / "tasks.jsonl").string());
  ASSERT_EQ(tasks.size(), 8u);
  for (const auto& t : tasks) {
    EXPECT_NE(
        t["base_url"].get<std::string>().find("/e/" + t["episode"].get<std::string>() + "/v1"),
        std::string::npos);
    EXPECT_FALSE(t["messages"].empty());
    EXPECT_EQ(t["max_tokens"], 5);
  }
}

TEST_F(AgentJob, TheEnvironmentScoresTheLastTurnsOfAgentsThatPostNoReward) {
  auto cfg = job("env", {"--reward", "none"}, {"rl.environment.kind=task"});
  ASSERT_TRUE(cfg) << describe(cfg.error());
  auto r = run(*cfg);
  ASSERT_TRUE(r) << describe(r.error()) << "\n" << agent_log(*cfg);
  auto lines = rl_metrics(cfg->run.dir);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(lines[1].contains("critic/env_score/mean"));
  EXPECT_DOUBLE_EQ(lines[1]["env/finish/done"].get<double>(), 1.0)
      << "the task environment ends every episode at its last turn";
}

TEST_F(AgentJob, EpisodesWithoutARewardOrACallAreNamed) {
  auto msg = failure("unrewarded", {"--unrewarded", "1"});
  EXPECT_NE(msg.find("episodes without a reward"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0.0.0"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("0.0.1"), std::string::npos) << msg;

  msg = failure("skipped", {"--skip", "2"});
  EXPECT_NE(msg.find("episodes without a call: 0.0.0, 0.0.1"), std::string::npos) << msg;
}

TEST_F(AgentJob, AHangingOrFailingAgentEndsTheIterationClearly) {
  auto msg = failure("hang", {"--hang"}, {"rl.agent.timeout_s=2"});
  EXPECT_NE(msg.find("still running after"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rl.agent.timeout_s"), std::string::npos) << msg;
  EXPECT_NE(msg.find("episodes without a reward: 0.0.0, 0.0.1"), std::string::npos) << msg;

  msg = failure("exit", {"--exit-code", "3"});
  EXPECT_NE(msg.find("exited with status 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("agent.log"), std::string::npos) << msg;

  auto cfg = job("missing", {});
  ASSERT_TRUE(cfg);
  cfg->rl.agent.command = {"no-such-agent-program"};
  auto r = run(*cfg);
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("'no-such-agent-program' is not an executable on PATH"),
            std::string::npos)
      << describe(r.error());
}

TEST(AgentConfig, AnAgentIsCheckedAndRefusesWhatEpisodesDoNotCombineWith) {
  test::temp_dir tmp;
  auto base = troupe::actors::rl::testing::tiny_job(tmp.file("x"), "");
  for (auto [set, path] : std::vector<std::pair<std::string, std::string>>{
           {"rl.agent.timeout_s=0", "rl.agent.timeout_s"},
           {"rl.agent.threads=0", "rl.agent.threads"},
           {"rl.agent.tls_cert_file=c.pem", "rl.agent.tls_key_file"},
           {"rl.staleness=1", "rl.staleness"}}) {
    auto cfg = troupe::actors::rl::testing::parse_job(base, {"rl.agent.command=[agent]", set});
    ASSERT_FALSE(cfg) << set;
    EXPECT_NE(describe(cfg.error()).find(path), std::string::npos) << describe(cfg.error());
  }
  EXPECT_TRUE(troupe::actors::rl::testing::parse_job(base, {"rl.agent.command=[agent]"}));
}

TEST(AgentHost, ProgramsAreFoundOnThePathAndNeverThroughAShell) {
  auto py = cluster::find_program("python3");
  ASSERT_TRUE(py) << describe(py.error());
  EXPECT_EQ(py->front(), '/');
  EXPECT_EQ(*cluster::find_program("./x"), "./x");
  EXPECT_FALSE(cluster::find_program("python3 -c 1"));
  EXPECT_FALSE(cluster::find_program(""));
}
