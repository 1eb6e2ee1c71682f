// End-to-end runs of tiny jobs through run_job: every stage, PPO and GRPO,
// resume exactness, injected role failures, bad job specs.
#include "actors/actor_system.hpp"
#include "actors/rl/job.hpp"
#include "runtime/checkpoint.hpp"
#include "runtime/file_io.hpp"
#include "tests/actors/job_runs.hpp"
#include "tests/actors/job_yaml.hpp"
#include "tests/support/temp_dir.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <unistd.h>

using namespace troupe;
using namespace troupe::actors::rl;

namespace {

using troupe::actors::rl::testing::expect_resume_continues_exactly;
using troupe::actors::rl::testing::run;
using troupe::actors::rl::testing::stage_lines;
using troupe::actors::rl::testing::tiny_job;

using troupe::actors::rl::testing::deterministic_part;
using troupe::actors::rl::testing::parse_job;

} // namespace

TEST(RlJob, PpoRunsEveryStageAndLogsVerlMetrics) {
  test::temp_dir tmp;
  auto cfg =
      parse_job(tiny_job(tmp.file("run"), "  reward: {kind: mixed}\n  critic: {init: rm}\n"));
  ASSERT_TRUE(cfg) << describe(cfg.error());
  std::vector<std::string> seen;
  run_options opts;
  opts.on_progress = [&](const progress_event& e) { seen.push_back(e.stage + std::to_string(e.step)); };
  auto r = run(*cfg, opts);
  ASSERT_TRUE(r.summary) << describe(r.summary.error());
  ASSERT_EQ(r.summary->stages.size(), 3u);
  EXPECT_FALSE(r.summary->stopped);
  for (const char* s : {"sft", "rm", "rl"}) {
    EXPECT_TRUE(std::filesystem::exists(tmp.path() / "run" / s / "done")) << s;
    EXPECT_TRUE(std::filesystem::exists(tmp.path() / "run" / s / "model" / "config.json")) << s;
  }
  EXPECT_EQ(stage_lines(r.metrics, "sft").size(), 3u);
  EXPECT_EQ(stage_lines(r.metrics, "rm").size(), 2u);
  auto rl = stage_lines(r.metrics, "rl");
  ASSERT_EQ(rl.size(), 4u); // step 0 (the starting score) + 3 iterations
  EXPECT_TRUE(rl[0].contains("val/score/mean"));
  for (size_t i = 1; i < rl.size(); ++i) {
    const auto& j = rl[i];
    for (const char* key : {"training/global_step",
                            "critic/score/mean",
                            "critic/rewards/mean",
                            "critic/advantages/mean",
                            "critic/returns/mean",
                            "critic/values/mean",
                            "critic/vf_loss",
                            "critic/vf_clipfrac",
                            "actor/pg_loss",
                            "actor/pg_clipfrac",
                            "actor/ppo_kl",
                            "actor/entropy",
                            "actor/grad_norm",
                            "actor/lr",
                            "response_length/mean",
                            "timing_s/gen",
                            "timing_s/ref",
                            "timing_s/values",
                            "timing_s/reward",
                            "timing_s/adv",
                            "timing_s/update_actor",
                            "timing_s/update_critic",
                            "timing_s/weight_sync",
                            "timing_s/step",
                            "perf/throughput",
                            "rollout/logprob_diff",
                            "critic/model_score/mean",
                            "critic/rule_score/mean",
                            "rollout_corr/logprob_abs_diff_mean",
                            "rollout_corr/logprob_abs_diff_max",
                            "rollout_corr/kl"})
      EXPECT_TRUE(j.contains(key)) << "iteration " << i << ": " << key;
    EXPECT_EQ(j["training/global_step"].get<double>(), static_cast<double>(i));
    // The phases are timed inside the step: their sum never exceeds it.
    // How close they come is a wall-clock figure, bench_job's ("timed
    // phases / step"): asserted here with 1 ms of slack on a ~20 ms toy
    // step, it failed whenever the machine was loaded (1.2 and 2.6 ms
    // between phases seen beside other suites), which is what made this
    // test flaky in full ctest runs.
    double phases = 0;
    for (const auto& [k, v] : j.items())
      if (k.rfind("timing_s/", 0) == 0 && k != "timing_s/step" && k != "timing_s/testing")
        phases += v.get<double>();
    double step = j["timing_s/step"].get<double>();
    EXPECT_GT(phases, 0.0);
    EXPECT_LE(phases, step * (1 + 1e-9));
    // The policy recomputes what the engine sampled: the two agree.
    EXPECT_LT(j["rollout_corr/logprob_abs_diff_mean"].get<double>(), 1e-4);
    EXPECT_EQ(j["rollout/logprob_diff"], j["rollout_corr/logprob_abs_diff_mean"]) << "old name";
    EXPECT_LT(std::abs(j["rollout_corr/kl"].get<double>()), 1e-4);
  }
  EXPECT_TRUE(rl[2].contains("val/score/mean"));  // eval_every 2
  EXPECT_FALSE(rl[1].contains("val/score/mean"));
  EXPECT_TRUE(rl[3].contains("val/score/mean"));  // and at the end
  EXPECT_EQ(seen.back(), "rl3");
  // A second run into the same directory without --resume is refused.
  auto again = run(*cfg);
  ASSERT_FALSE(again.summary);
  EXPECT_NE(describe(again.summary.error()).find("--resume"), std::string::npos);
}

TEST(RlJob, GrpoRunsWithoutACritic) {
  test::temp_dir tmp;
  auto cfg = parse_job(tiny_job(tmp.file("run"), "  algorithm: grpo\n  samples_per_prompt: 4\n"
                                                 "  kl: {coef: 0.01, estimator: low_var_kl}\n"),
                       {"stages=[sft, rl]"});
  ASSERT_TRUE(cfg) << describe(cfg.error());
  auto r = run(*cfg);
  ASSERT_TRUE(r.summary) << describe(r.summary.error());
  auto rl = stage_lines(r.metrics, "rl");
  ASSERT_EQ(rl.size(), 4u);
  for (size_t i = 1; i < rl.size(); ++i) {
    EXPECT_FALSE(rl[i].contains("critic/vf_loss"));
    EXPECT_FALSE(rl[i].contains("timing_s/values"));
    EXPECT_TRUE(rl[i].contains("actor/kl_loss"));
    EXPECT_EQ(rl[i]["actor/reward_kl_penalty_coeff"].get<double>(), 0.01);
    // 4 prompts × 4 samples: group advantages are centred per group.
    EXPECT_NEAR(rl[i]["critic/advantages/mean"].get<double>(), 0.0, 0.35);
  }
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "run" / "rm"));
}

TEST(RlJob, CriticFreeEstimatorsRun) {
  for (const char* adv : {"rloo", "reinforce_pp", "reinforce_pp_baseline"}) {
    test::temp_dir tmp;
    auto cfg =
        parse_job(tiny_job(tmp.file("run"), "  samples_per_prompt: 2\n"),
                  {"stages=[sft, rl]", "rl.iterations=2", std::string{"rl.advantage="} + adv});
    ASSERT_TRUE(cfg) << describe(cfg.error());
    auto r = run(*cfg);
    ASSERT_TRUE(r.summary) << adv << ": " << describe(r.summary.error());
    auto rl = stage_lines(r.metrics, "rl");
    ASSERT_EQ(rl.size(), 3u) << adv;
    EXPECT_FALSE(rl[1].contains("critic/vf_loss")) << adv;
  }
}

// The algorithm menu's choices run end to end on the tiny job: GSPO, CISPO
// with clip-higher and no dual clip, the additive aggregation modes, Dr.
// GRPO, the straight-through KL, and ReMax (on the addition task), whose
// greedy baseline is its own timed phase.
TEST(RlJob, TheAlgorithmMenuRuns) {
  const std::vector<std::vector<std::string>> cases{
      {"rl.algorithm=grpo", "rl.samples_per_prompt=2", "rl.policy_loss=gspo",
       "rl.clip_ratio_low=0.0003", "rl.clip_ratio_high=0.0004"},
      {"rl.algorithm=grpo", "rl.samples_per_prompt=2", "rl.policy_loss=cispo",
       "rl.clip_ratio_low=1", "rl.clip_ratio_high=0.28", "rl.loss_agg=token-sum",
       "rl.kl.estimator=k3+"},
      {"rl.algorithm=grpo", "rl.samples_per_prompt=2", "rl.clip_ratio_high=0.28",
       "rl.clip_ratio_c=null", "rl.loss_agg=seq-mean-token-sum-norm", "rl.norm_adv_by_std=false"},
      {"rl.advantage=remax", "rl.samples_per_prompt=2", "rl.kl.coef=0", "data.task=add",
       "data.min_digits=1", "data.max_digits=2"},
  };
  for (const auto& sets : cases) {
    std::string name;
    for (const auto& s : sets)
      name += s + " ";
    SCOPED_TRACE(name);
    test::temp_dir tmp;
    auto all = sets;
    all.insert(all.begin(), {"stages=[sft, rl]", "rl.iterations=2"});
    auto cfg = parse_job(tiny_job(tmp.file("run")), all);
    ASSERT_TRUE(cfg) << describe(cfg.error());
    auto r = run(*cfg);
    ASSERT_TRUE(r.summary) << describe(r.summary.error());
    auto rl = stage_lines(r.metrics, "rl");
    ASSERT_EQ(rl.size(), 3u);
    for (size_t i = 1; i < rl.size(); ++i) {
      EXPECT_TRUE(std::isfinite(rl[i]["actor/pg_loss"].get<double>()));
      EXPECT_FALSE(rl[i].contains("critic/vf_loss"));
      const bool remax = cfg->rl.advantage == kernels::advantage_estimator::remax;
      EXPECT_EQ(rl[i].contains("timing_s/baseline"), remax);
      EXPECT_EQ(rl[i].contains("critic/baseline_score/mean"), remax);
      if (remax) {
        auto b = rl[i]["critic/baseline_score/mean"].get<double>();
        EXPECT_GE(b, 0.0);
        EXPECT_LE(b, 1.0);
      }
    }
  }
}

// NOTE [dynamic sampling] on the addition task with an exact-match reward
// (most groups of a barely trained policy score all 0): uniform groups are
// dropped, refill rounds generate more, the batch keeps its shape, the
// counts add up, and two runs do the same.
TEST(RlJob, DynamicSamplingDropsUniformGroupsAndRefills) {
  std::vector<std::vector<nlohmann::json>> runs;
  for (int attempt = 0; attempt < 2; ++attempt) {
    test::temp_dir tmp;
    auto cfg = parse_job(tiny_job(tmp.file("run")),
                         {"stages=[sft, rl]", "rl.iterations=2", "rl.algorithm=grpo",
                          "rl.samples_per_prompt=4", "rl.reward.rule=exact", "data.task=add",
                          "data.min_digits=1", "data.max_digits=1", "sft.steps=20",
                          "rl.dynamic_sampling.enabled=true", "rl.dynamic_sampling.max_rounds=2"});
    ASSERT_TRUE(cfg) << describe(cfg.error());
    auto r = run(*cfg);
    ASSERT_TRUE(r.summary) << describe(r.summary.error());
    auto rl = stage_lines(r.metrics, "rl");
    ASSERT_EQ(rl.size(), 3u);
    double dropped_total = 0;
    for (size_t i = 1; i < rl.size(); ++i) {
      auto rounds = rl[i]["rollout/dynamic_sampling/rounds"].get<double>();
      auto generated = rl[i]["rollout/dynamic_sampling/groups_generated"].get<double>();
      auto dropped = rl[i]["rollout/dynamic_sampling/groups_dropped"].get<double>();
      auto padded = rl[i]["rollout/dynamic_sampling/groups_padded"].get<double>();
      EXPECT_LE(rounds, 2.0);
      EXPECT_EQ(generated, 4.0 * (rounds + 1));
      EXPECT_EQ(padded, std::max(0.0, 4.0 - (generated - dropped)));
      if (rounds < 2) { // it stopped because the batch was full
        EXPECT_EQ(padded, 0.0);
      }
      dropped_total += dropped;
      // The batch keeps its shape: 4 prompts × 4 samples.
      EXPECT_EQ(rl[i]["response_length/mean"].is_number(), true);
    }
    EXPECT_GT(dropped_total, 0.0) << "no uniform group: the case is not covered";
    for (auto& j : rl)
      j = deterministic_part(j);
    runs.push_back(rl);
  }
  for (size_t i = 0; i < runs[0].size(); ++i)
    EXPECT_EQ(runs[0][i].dump(), runs[1][i].dump());
}

// NOTE [dpo stage]: sft, then DPO on the task's preference pairs. The first
// step's policy is its reference: every implicit reward is 0 and the
// sigmoid loss is ln 2. Training moves the held-out pairs' implicit reward
// margin up and orders most of them as labelled.
TEST(RlJob, DpoStageLearnsThePreferences) {
  test::temp_dir tmp;
  auto cfg = parse_job(tiny_job(tmp.file("run")),
                       {"stages=[sft, dpo]", "dpo.steps=12", "dpo.batch_size=8", "dpo.eval_every=6",
                        "dpo.beta=0.5", "dpo.optim.lr=0.003"});
  ASSERT_TRUE(cfg) << describe(cfg.error());
  auto r = run(*cfg);
  ASSERT_TRUE(r.summary) << describe(r.summary.error());
  auto dpo = stage_lines(r.metrics, "dpo");
  ASSERT_EQ(dpo.size(), 12u);
  EXPECT_NEAR(dpo[0]["dpo/loss"].get<double>(), std::log(2.0), 1e-4);
  EXPECT_NEAR(dpo[0]["rewards/margins"].get<double>(), 0.0, 1e-4);
  for (const char* key : {"rewards/chosen", "rewards/rejected", "rewards/accuracies",
                          "logps/chosen", "logps/rejected", "dpo/grad_norm", "dpo/lr"})
    EXPECT_TRUE(dpo[0].contains(key)) << key;
  EXPECT_TRUE(dpo[5].contains("val/rewards/accuracies"));
  EXPECT_FALSE(dpo[4].contains("val/rewards/accuracies"));
  const auto& last = dpo.back();
  EXPECT_GT(last["val/rewards/margins"].get<double>(), 0.0);
  EXPECT_GE(last["val/rewards/accuracies"].get<double>(), 0.6);
  EXPECT_LT(last["dpo/loss"].get<double>(), std::log(2.0));
  EXPECT_TRUE(std::filesystem::exists(tmp.path() / "run" / "dpo" / "model" / "config.json"));
}

// NOTE [groups of one]: GRPO with one sample per prompt runs, each sample's
// advantage its raw score, and the log names a prompt.
TEST(RlJob, AGroupOfOneGetsItsScoreAndAWarning) {
  test::temp_dir tmp;
  auto cfg = parse_job(tiny_job(tmp.file("run")),
                       {"stages=[sft, rl]", "rl.iterations=1", "rl.algorithm=grpo",
                        "rl.samples_per_prompt=1", "rl.kl.coef=0"});
  ASSERT_TRUE(cfg) << describe(cfg.error());
  auto r = run(*cfg);
  ASSERT_TRUE(r.summary) << describe(r.summary.error());
  auto rl = stage_lines(r.metrics, "rl");
  ASSERT_EQ(rl.size(), 2u);
  // Positional scores are in [0, 1]: every advantage is a raw score / (1 + eps).
  EXPECT_GE(rl[1]["critic/advantages/min"].get<double>(), 0.0);
  EXPECT_NEAR(rl[1]["critic/advantages/max"].get<double>(),
              rl[1]["critic/score/max"].get<double>() / (1 + 1e-6), 1e-5);
  std::ifstream in(tmp.path() / "run" / "troupe.log");
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find("4 sample(s) alone in their group (first: the prompt \"sort:"),
            std::string::npos)
      << text.str();
}

// 4 iterations straight vs 2, a stop (as SIGINT does), --resume, 2 more:
// the same metrics and bit-identical weights.
class RlJobResume : public ::testing::TestWithParam<bool> {};

TEST_P(RlJobResume, ContinuesExactly) {
  // Two samples per prompt: with caching on, the second shares the first's
  // prompt blocks, so the engine's history differs between the runs.
  expect_resume_continues_exactly(
      {"rl.iterations=4", "rl.checkpoint_every=0", "rl.samples_per_prompt=2",
       std::string{"rl.rollout.enable_prefix_caching="} + (GetParam() ? "true" : "false")});
}

INSTANTIATE_TEST_SUITE_P(PrefixCaching, RlJobResume, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "On" : "Off"; });

TEST(RlJob, EveryWeightTransportGivesTheSameRun) {
  // The rollout gets each version through alias (zero copy), shared memory,
  // disk or a gloo broadcast: the same bytes, so the same run, and nothing
  // left behind.
  test::temp_dir tmp;
  std::vector<std::vector<nlohmann::json>> runs;
  for (std::string kind : {"alias", "shm", "disk", "broadcast"}) {
    auto cfg =
        parse_job(tiny_job(tmp.file(kind)), {"stages=[sft, rl]", "rl.iterations=2",
                                             "weight_sync.transport=" + kind, "sft.eval_every=2"});
    ASSERT_TRUE(cfg) << describe(cfg.error());
    auto r = run(*cfg);
    ASSERT_TRUE(r.summary) << kind << ": " << describe(r.summary.error());
    std::vector<nlohmann::json> lines;
    for (const auto& j : r.metrics)
      lines.push_back(deterministic_part(j));
    runs.push_back(std::move(lines));
    EXPECT_FALSE(std::filesystem::exists(tmp.path() / kind / "rl" / "weights"))
        << kind << ": versions left on disk";
    troupe::actors::rl::testing::expect_sync_staging(cfg->run.dir, false);
  }
  for (size_t k = 1; k < runs.size(); ++k)
    EXPECT_EQ(runs[0], runs[k]) << "transport " << k << " gives another run";
  std::string lead = "troupe.troupe-job-" + std::to_string(::getpid()) + "-";
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    EXPECT_NE(e.path().filename().string().rfind(lead, 0), 0u)
        << "segment left behind: " << e.path();
}

class RlJobOffload : public ::testing::TestWithParam<std::string> {};

TEST_P(RlJobOffload, GivesTheSameRunAndLeavesNothingBehind) {
  // placement.offload frees the KV pool after generation, the reference's
  // (and a reward model's) weights after their phase, and writes the
  // optimizer states to disk after each update: training continues exactly.
  test::temp_dir tmp;
  std::vector<std::vector<nlohmann::json>> runs;
  std::vector<std::string> reward = {"rl.reward.kind=" + GetParam()};
  reward.push_back(GetParam() == "rule" ? "stages=[sft, rl]" : "stages=[sft, rm, rl]");
  for (std::string offload : {"false", "true"}) {
    auto sets = reward;
    sets.push_back("placement.offload=" + offload);
    auto cfg = parse_job(tiny_job(tmp.file(offload)), sets);
    ASSERT_TRUE(cfg) << describe(cfg.error());
    auto r = run(*cfg);
    ASSERT_TRUE(r.summary) << describe(r.summary.error());
    std::vector<nlohmann::json> lines;
    for (auto j : r.metrics) {
      if (j["stage"] == "rl" && j["step"] > 0 && offload == "true") {
        EXPECT_GT(j.value("perf/offloaded_bytes", 0.0), 0.0) << j.dump();
        j.erase("perf/offloaded_bytes");
      }
      lines.push_back(deterministic_part(j));
    }
    runs.push_back(std::move(lines));
  }
  EXPECT_EQ(runs[0], runs[1]);
  auto offload_dir = tmp.path() / "true" / "rl" / "offload";
  ASSERT_TRUE(std::filesystem::exists(offload_dir));
  EXPECT_TRUE(std::filesystem::is_empty(offload_dir)) << "offloaded states left behind";
}

INSTANTIATE_TEST_SUITE_P(Reward, RlJobOffload, ::testing::Values("rule", "mixed"));

TEST(RlJob, OffloadFreesTheRewardModelsWeightsToo) {
  // With a reward model in the mix, each iteration frees its weights as
  // well: more bytes than with the rule alone.
  test::temp_dir tmp;
  std::map<std::string, double> freed;
  for (std::string kind : {"rule", "mixed"}) {
    auto cfg =
        parse_job(tiny_job(tmp.file(kind)),
                  {"stages=[sft, rm, rl]", "rl.reward.kind=" + kind, "placement.offload=true"});
    ASSERT_TRUE(cfg) << describe(cfg.error());
    auto r = run(*cfg);
    ASSERT_TRUE(r.summary) << describe(r.summary.error());
    for (const auto& j : r.metrics)
      if (j["stage"] == "rl" && j["step"] == 2)
        freed[kind] = j.value("perf/offloaded_bytes", 0.0);
  }
  EXPECT_GT(freed["rule"], 0.0);
  EXPECT_GT(freed["mixed"], freed["rule"]);
}

TEST(RlJob, EachStepsRolloutCountersAndBusyTimeAreItsOwn) {
  // NOTE [busy on replies]: the roles' seconds and the rollout's counters
  // come with their answers; the evaluations between steps (here after
  // every one, and before the first) must not leak into the next step.
  test::temp_dir tmp;
  auto cfg = parse_job(tiny_job(tmp.file("run")),
                       {"stages=[sft, rl]", "rl.iterations=3", "rl.eval_every=1"});
  ASSERT_TRUE(cfg);
  auto r = run(*cfg);
  ASSERT_TRUE(r.summary) << describe(r.summary.error());
  auto lines = stage_lines(r.metrics, "rl");
  ASSERT_EQ(lines.size(), 4u);
  for (size_t step = 1; step <= 3; ++step) {
    const auto& j = lines[step];
    auto rows = j["perf/total_num_tokens"].get<double>() > 0 ? 4.0 * (*cfg).rl.samples_per_prompt : 0.0;
    EXPECT_DOUBLE_EQ(j["rollout/generated_tokens"].get<double>(), j["response_length/mean"].get<double>() * rows)
        << "step " << step << ": the step's own generation only";
    auto share = j["perf/orchestration_share"].get<double>();
    EXPECT_GE(share, 0.0) << step;
    EXPECT_LT(share, 1.0) << "step " << step << ": the roles' compute was counted";
    EXPECT_GT(j["rollout/tokens_per_s"].get<double>(), 0.0) << step;
  }
}

TEST(RlJob, AStopBeforeAnyUpdateAbandonsTheIterationAndResumes) {
  test::temp_dir tmp;
  auto cfg = parse_job(tiny_job(tmp.file("run")), {"stages=[sft, rl]", "rl.iterations=2"});
  ASSERT_TRUE(cfg);
  std::atomic<bool> stop{false};
  run_options first;
  first.stop = &stop;
  // Stop during the first RL iteration's generation: the step-0 evaluation
  // is the last progress event before it.
  first.on_progress = [&](const progress_event& e) {
    if (e.stage == "rl" && e.step == 0)
      stop = true;
  };
  auto r1 = run(*cfg, first);
  ASSERT_TRUE(r1.summary) << describe(r1.summary.error());
  EXPECT_TRUE(r1.summary->stopped);
  EXPECT_EQ(r1.summary->stages.back().steps, 0);
  auto latest = runtime::latest_checkpoint((tmp.path() / "run" / "rl" / "checkpoints").string());
  ASSERT_TRUE(latest) << describe(latest.error());
  EXPECT_TRUE(runtime::read_checkpoint(*latest));
  run_options second;
  second.resume = true;
  auto r2 = run(*cfg, second);
  ASSERT_TRUE(r2.summary) << describe(r2.summary.error());
  EXPECT_EQ(stage_lines(r2.metrics, "rl").size(), 3u);
}

TEST(RlJob, AFailingRoleEndsTheJobWithItsNameAndPhase) {
  struct fault {
    const char* role;
    const char* phase;
  };
  for (auto f : {fault{"critic", "update_critic"}, fault{"reward", "reward"},
                 fault{"policy", "old_log_prob"}, fault{"reference", "ref"}}) {
    test::temp_dir tmp;
    auto cfg = parse_job(tiny_job(tmp.file("run")),
                         {"stages=[sft, rl]", std::string{"debug.fail_role="} + f.role,
                          std::string{"debug.fail_phase="} + f.phase, "debug.fail_iteration=2"});
    ASSERT_TRUE(cfg) << describe(cfg.error());
    auto t0 = std::chrono::steady_clock::now();
    auto r = run(*cfg);
    auto secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_FALSE(r.summary) << f.role;
    auto msg = describe(r.summary.error());
    EXPECT_NE(msg.find("rl iteration 2"), std::string::npos) << msg;
    EXPECT_NE(msg.find(std::string{f.role} + ": "), std::string::npos) << msg;
    EXPECT_NE(msg.find("injected failure"), std::string::npos) << msg;
    EXPECT_LT(secs, 30.0) << "a failure must end the job promptly, not at the request timeout";
    // Iteration 1 finished and was logged; nothing of iteration 2 was.
    EXPECT_EQ(stage_lines(r.metrics, "rl").size(), 2u) << f.role;
  }
}

TEST(RlJob, RunsOnADatasetFileWithVerifiableRules) {
  test::temp_dir tmp;
  // Custom and nested field names, one prompt too long for the context (24
  // tokens: 5 new + BOS leave 18 bytes), a quarter held out for evaluation.
  std::string rows;
  for (int i = 0; i < 32; ++i)
    rows += "{\"q\": \"add:" + std::to_string(i) +
            "+1=\", \"gt\": {\"value\": " + std::to_string(i + 1) + "}}\n";
  rows += "{\"q\": \"add:this prompt is far too long=\", \"gt\": {\"value\": 0}}\n";
  auto file = tmp.write("train.jsonl", rows);
  auto cfg =
      parse_job(tiny_job(tmp.file("run"), "  algorithm: grpo\n  samples_per_prompt: 2\n"
                                          "  reward:\n    rules:\n"
                                          "      - {kind: math, extract: flexible}\n"
                                          "      - {kind: format, pattern: '\\d+', weight: 0.5}\n"),
                {"stages=[sft, rl]", "rl.iterations=2", "data.train_file=" + file,
                 "data.eval_split=0.25", "data.fields.prompt=q", "data.fields.answer=gt.value"});
  ASSERT_TRUE(cfg) << describe(cfg.error());
  auto r = run(*cfg);
  ASSERT_TRUE(r.summary) << describe(r.summary.error());
  auto rl = stage_lines(r.metrics, "rl");
  ASSERT_FALSE(rl.empty());
  ASSERT_TRUE(rl.back().contains("val/accuracy")) << rl.back().dump();
  for (const auto& m : rl) {
    EXPECT_EQ(m.contains("critic/score/mean"), m.contains("critic/rule_score/mean"));
    if (!m.contains("val/score/mean"))
      continue;
    EXPECT_GE(m["val/score/mean"].get<double>(), 0.0);
    EXPECT_LE(m["val/score/mean"].get<double>(), 1.5) << "math 1 + format 0.5 at most";
  }
  std::ifstream log(tmp.path() / "run" / "troupe.log");
  std::stringstream text;
  text << log.rdbuf();
  EXPECT_NE(text.str().find("data.train_file: 1 of 33 prompts dropped as too long"),
            std::string::npos)
      << text.str();
}

// The contract's metrics with the engine's old log-probs: measured against
// the update's first minibatch (NOTE [first-minibatch contract]), within the
// bound docs/data-and-rewards.md gives for the ATen paths.
TEST(RlJob, EngineOldLogProbsReportTheContractFromTheUpdate) {
  test::temp_dir tmp;
  auto cfg = parse_job(tiny_job(tmp.file("run")), {"stages=[sft, rl]", "rl.old_logprobs=engine"});
  ASSERT_TRUE(cfg) << describe(cfg.error());
  auto r = run(*cfg);
  ASSERT_TRUE(r.summary) << describe(r.summary.error());
  auto rl = stage_lines(r.metrics, "rl");
  ASSERT_EQ(rl.size(), 4u);
  for (size_t i = 1; i < rl.size(); ++i) {
    const auto& j = rl[i];
    EXPECT_EQ(j["rollout_corr/logprob_abs_diff_mean"],
              j["actor/first_minibatch/logprob_abs_diff_mean"]);
    EXPECT_EQ(j["rollout_corr/kl"], j["actor/first_minibatch/ppo_kl"]);
    EXPECT_LT(j["rollout_corr/logprob_abs_diff_max"].get<double>(), 1e-4) << i;
    EXPECT_GT(j["rollout_corr/logprob_abs_diff_max"].get<double>(), 0.0)
        << i << ": the ATen paths differ in the last bits";
  }
}

// NOTE [true on-policy]: a shortened quickstart (its model, task and PPO
// settings; fewer steps) where every step's sampled, old and first-update
// log-probs are equal: with the policy's old log-probs (4 minibatches), and
// with the engine's in one minibatch (the whole update's ratios exactly 1).
TEST(RlJob, TrueOnPolicyShortenedQuickstartIsExact) {
  auto yaml = runtime::read_file(std::string{TROUPE_SOURCE_DIR} + "/configs/quickstart.yaml");
  ASSERT_TRUE(yaml) << describe(yaml.error());
  for (const char* mode : {"policy", "engine"}) {
    SCOPED_TRACE(mode);
    test::temp_dir tmp;
    std::vector<std::string> sets{"run.dir=" + tmp.file("run"),
                                  "run.progress=none",
                                  "sft.steps=8",
                                  "sft.eval_every=0",
                                  "rm.steps=4",
                                  "rm.eval_every=0",
                                  "data.train_size=256",
                                  "data.eval_size=8",
                                  "rl.iterations=3",
                                  "rl.prompts_per_iteration=16",
                                  "rl.eval_every=0",
                                  "rl.eval_samples=1",
                                  "rl.checkpoint_every=0",
                                  "rl.true_on_policy=true",
                                  std::string{"rl.old_logprobs="} + mode};
    if (std::string{mode} == "engine")
      sets.push_back("rl.minibatches=1");
    auto cfg = parse_job(*yaml, sets);
    ASSERT_TRUE(cfg) << describe(cfg.error());
    auto r = run(*cfg);
    ASSERT_TRUE(r.summary) << describe(r.summary.error());
    auto rl = stage_lines(r.metrics, "rl");
    ASSERT_EQ(rl.size(), 4u);
    for (size_t i = 1; i < rl.size(); ++i) {
      const auto& j = rl[i];
      for (const char* key :
           {"rollout_corr/logprob_abs_diff_mean", "rollout_corr/logprob_abs_diff_max",
            "rollout_corr/kl", "actor/first_minibatch/logprob_abs_diff_mean",
            "actor/first_minibatch/logprob_abs_diff_max", "actor/first_minibatch/ppo_kl"})
        EXPECT_EQ(j[key].get<double>(), 0.0) << "iteration " << i << ": " << key;
      if (std::string{mode} == "engine") {
        EXPECT_EQ(j["actor/ppo_kl"].get<double>(), 0.0) << i;
        EXPECT_EQ(j["actor/pg_clipfrac"].get<double>(), 0.0) << i;
      }
      EXPECT_GT(j["actor/grad_norm"].get<double>(), 0.0) << i;
    }
  }
}

TEST(RlJob, TrueOnPolicyRefusesWhatBreaksIt) {
  test::temp_dir tmp;
  const auto yaml = tiny_job(tmp.file("run"));
  const std::vector<std::pair<std::string, std::string>> cases{
      {"rl.staleness=1", "rl.staleness"},
      {"rl.generation.top_k=5", "rl.generation.top_k"},
      {"rl.generation.top_p=0.9", "rl.generation.top_p"}};
  for (const auto& [set, path] : cases) {
    auto cfg = parse_job(yaml, {"rl.true_on_policy=true", set});
    ASSERT_FALSE(cfg) << set;
    EXPECT_NE(describe(cfg.error()).find(path), std::string::npos) << describe(cfg.error());
    EXPECT_NE(describe(cfg.error()).find("true_on_policy"), std::string::npos);
  }
  auto tp = parse_job(yaml + "placement:\n  mode: colocated\n  pools: [{name: all, devices: 2}]\n"
                             "  roles: [{role: policy, pool: all, tp: 2}]\n",
                      {"rl.true_on_policy=true"});
  ASSERT_FALSE(tp);
  EXPECT_NE(describe(tp.error()).find("placement.roles[policy].tp"), std::string::npos)
      << describe(tp.error());
}
