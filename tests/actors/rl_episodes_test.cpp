// NOTE [episodes] in whole jobs: a single-turn task environment gives the
// batch path's run, episodes with the calculator environment train, and
// the first turn of a two-turn episode takes its advantage from the final
// reward across the masked observation.

#include "actors/rl/data.hpp"
#include "actors/rl/job.hpp"
#include "kernels/gae.hpp"
#include "kernels/losses.hpp"
#include "tests/actors/job_runs.hpp"
#include "tests/actors/job_yaml.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>

using namespace troupe;
using namespace troupe::actors::rl;
using troupe::actors::rl::testing::deterministic_part;
using troupe::actors::rl::testing::parse_job;
using troupe::actors::rl::testing::run;
using troupe::actors::rl::testing::stage_lines;
using troupe::actors::rl::testing::tiny_job;

namespace {

// The metrics without the environment's own (env/..., val/env/...) and timings.
std::vector<nlohmann::json> comparable(const std::vector<nlohmann::json>& metrics) {
  std::vector<nlohmann::json> out;
  for (auto j : stage_lines(metrics, "rl")) {
    j = deterministic_part(j);
    for (auto it = j.begin(); it != j.end();)
      it = it.key().rfind("env/", 0) == 0 || it.key().find("/env/") != std::string::npos
               ? j.erase(it)
               : std::next(it);
    out.push_back(j);
  }
  return out;
}

const char* grpo = "  algorithm: grpo\n  samples_per_prompt: 2\n";

} // namespace

TEST(RlEpisodes, ASingleTurnTaskEnvironmentGivesTheBatchPathsRun) {
  test::temp_dir tmp;
  auto batch =
      parse_job(tiny_job(tmp.file("batch"), grpo), {"stages=[sft, rl]", "rl.iterations=2"});
  auto episodes = parse_job(tiny_job(tmp.file("episodes"), grpo),
                            {"stages=[sft, rl]", "rl.iterations=2", "rl.environment.kind=task",
                             "rl.environment.score=reward"});
  ASSERT_TRUE(batch && episodes);
  auto a = run(*batch), b = run(*episodes);
  ASSERT_TRUE(a.summary) << describe(a.summary.error());
  ASSERT_TRUE(b.summary) << describe(b.summary.error());
  EXPECT_EQ(comparable(a.metrics), comparable(b.metrics))
      << "the task environment's episodes sample and score what the batch path does";
  troupe::actors::rl::testing::expect_same_final_weights(batch->run.dir, episodes->run.dir);
  auto lines = stage_lines(b.metrics, "rl");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1]["env/turns/mean"].get<double>(), 1.0);
  EXPECT_EQ(lines[1]["env/episodes"].get<double>(), 8.0);
  // Scored by the environment (the same rule), the scores are the same.
  auto by_env = parse_job(tiny_job(tmp.file("by-env"), grpo),
                          {"stages=[sft, rl]", "rl.iterations=2", "rl.environment.kind=task"});
  ASSERT_TRUE(by_env);
  auto c = run(*by_env);
  ASSERT_TRUE(c.summary) << describe(c.summary.error());
  auto la = stage_lines(a.metrics, "rl"), lc = stage_lines(c.metrics, "rl");
  for (size_t i = 1; i < la.size(); ++i) {
    EXPECT_EQ(la[i]["critic/score/mean"], lc[i]["critic/score/mean"]) << i;
    EXPECT_EQ(lc[i]["critic/env_score/mean"], lc[i]["critic/score/mean"]) << i;
  }
}

TEST(RlEpisodes, CalculatorEpisodesRunAndReportTheirMetrics) {
  test::temp_dir tmp;
  auto cfg = parse_job(tiny_job(tmp.file("run"), grpo),
                       {"stages=[sft, rl]", "rl.iterations=2", "data.task=add", "data.min_digits=1",
                        "data.max_digits=2", "rl.environment.kind=calculator",
                        "rl.environment.max_turns=3", "rl.environment.score=sum"});
  ASSERT_TRUE(cfg) << describe(cfg.error());
  auto r = run(*cfg);
  ASSERT_TRUE(r.summary) << describe(r.summary.error());
  auto lines = stage_lines(r.metrics, "rl");
  ASSERT_EQ(lines.size(), 3u);
  // Held-out episodes too (NOTE [episodes]): at step 0 and the end.
  for (size_t i : {size_t{0}, lines.size() - 1})
    for (const char* k : {"val/env/turns/mean", "val/env/tool_call_rate", "val/score/mean",
                          "val/accuracy", "val/greedy/env/turns/mean"})
      EXPECT_TRUE(lines[i].contains(k)) << k << " at line " << i;
  for (size_t i = 1; i < lines.size(); ++i) {
    for (const char* k :
         {"env/turns/mean", "env/tool_call_rate", "env/tool_error_rate", "env/step_latency_ms/p50",
          "env/step_latency_ms/p99", "env/generated_tokens/mean", "env/observation_tokens/mean",
          "env/reward/mean", "env/finish/done", "critic/env_score/mean"})
      EXPECT_TRUE(lines[i].contains(k)) << k;
    EXPECT_GE(lines[i]["env/turns/mean"].get<double>(), 1.0);
    EXPECT_LE(lines[i]["env/turns/max"].get<double>(), 3.0);
  }
}

TEST(RlEpisodes, EpisodesRefuseWhatTheyDoNotCombineWith) {
  test::temp_dir tmp;
  for (auto [set, path] : std::vector<std::pair<std::string, std::string>>{
           {"rl.staleness=1", "rl.staleness"},
           {"rl.dynamic_sampling.enabled=true", "rl.dynamic_sampling.enabled"},
           {"rl.environment.max_turns=0", "rl.environment.max_turns"},
           {"rl.environment.timeout_s=0", "rl.environment.timeout_s"}}) {
    auto cfg = parse_job(tiny_job(tmp.file("x"), grpo), {"rl.environment.kind=calculator", set});
    ASSERT_FALSE(cfg) << set;
    EXPECT_NE(describe(cfg.error()).find(path), std::string::npos) << describe(cfg.error());
  }
  auto remote = parse_job(tiny_job(tmp.file("x"), grpo), {"rl.environment.kind=remote"});
  ASSERT_FALSE(remote);
  EXPECT_NE(describe(remote.error()).find("rl.environment.remote.address"), std::string::npos);
}

// NOTE [episodes]: a two-turn episode — turn 1 (3 tokens), an observation
// (2 tokens, masked), turn 2 (2 tokens) — with its outcome reward at the
// end: GAE runs over the model's tokens only, so turn 1's tokens receive
// the final reward discounted by the model tokens after them, and the
// observation tokens none.
TEST(RlEpisodes, TheFirstTurnTakesItsAdvantageFromTheFinalRewardAcrossTheObservation) {
  std::vector<std::vector<int64_t>> prompts{{1, 5, 6}};
  std::vector<std::vector<int64_t>> responses{{7, 8, 2, 40, 41, 9, 2}};
  std::vector<std::vector<float>> loss{{1, 1, 1, 0, 0, 1, 1}};
  auto b = collate_sequences(prompts, responses, 0);
  ASSERT_TRUE(b);
  const auto length = b->get("input_ids").value().size(1);
  auto mask = b->get("response_mask").value() * scatter_response_values(prompts, loss, length);
  auto zeros = torch::zeros_like(mask);
  auto tr = kernels::token_level_rewards(torch::tensor({2.0f}), zeros, zeros, mask, 0.0);
  ASSERT_TRUE(tr);
  const double gamma = 1.0, lam = 0.9;
  auto a = kernels::gae(tr->rewards, zeros, mask, gamma, lam);
  ASSERT_TRUE(a);
  auto adv = a->advantages[0];
  // Response positions start at column prompt - 1 = 2 of the [B, L-1] layout.
  std::vector<double> want{
      2 * std::pow(lam, 4), 2 * std::pow(lam, 3), 2 * std::pow(lam, 2), 0, 0, 2 * lam, 2};
  for (size_t j = 0; j < want.size(); ++j)
    EXPECT_NEAR(adv[2 + static_cast<int64_t>(j)].item<double>(), want[j], 1e-6) << j;
  EXPECT_EQ(tr->rewards[0][8].item<float>(), 2.0f) << "the outcome at the last model token";
}
