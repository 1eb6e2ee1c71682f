// NOTE [staleness] (actors/rl/rl_stage.cpp): batches generated ahead of
// training, with and without in-flight weight updates (NOTE [in-flight
// update] in actors/inference/engine.hpp): every token within the bound,
// the distribution of lags reported, stale tokens corrected, and a resumed
// run equal to the uninterrupted one. The rollout fleet's runs (rollout dp
// 2, in worker processes) are in tests/cluster/rollout_fleet_integration_test.cpp.
#include "runtime/checkpoint.hpp"
#include "tests/actors/job_runs.hpp"
#include "tests/actors/job_yaml.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cmath>
#include <string>
#include <vector>

using namespace troupe;
using namespace troupe::actors::rl;
using troupe::actors::rl::testing::deterministic_part;
using troupe::actors::rl::testing::expect_resume_continues_exactly;
using troupe::actors::rl::testing::parse_job;
using troupe::actors::rl::testing::run;
using troupe::actors::rl::testing::stage_lines;
using troupe::actors::rl::testing::stop_after_rl_step;
using troupe::actors::rl::testing::tiny_job;

namespace {

// The lags' distribution of one metrics line: frac_0 .. frac_k.
std::vector<double> lag_fractions(const nlohmann::json& j, int k) {
  std::vector<double> out;
  for (int d = 0; d <= k; ++d)
    out.push_back(j.at("rollout/staleness/frac_" + std::to_string(d)).get<double>());
  return out;
}

// The tiny job (sft, then 5 rl iterations) with `sets`: its rl lines.
std::vector<nlohmann::json> rl_lines_of(const test::temp_dir& tmp, std::vector<std::string> sets) {
  sets.insert(sets.begin(), {"stages=[sft, rl]", "rl.iterations=5"});
  auto cfg = parse_job(tiny_job(tmp.file("run")), sets);
  EXPECT_TRUE(cfg) << describe(cfg.error());
  if (!cfg)
    return {};
  auto r = run(*cfg);
  EXPECT_TRUE(r.summary) << describe(r.summary.error());
  return stage_lines(r.metrics, "rl");
}

} // namespace

// NOTE [staleness]: the checkpoint holds the batch sampled ahead (ahead_batches.bin),
// so a resumed asynchronous run trains on what the uninterrupted one does.
TEST(RlAsync, StalenessOneResumesExactly) {
  expect_resume_continues_exactly({"rl.iterations=4", "rl.checkpoint_every=0", "rl.staleness=1"});
}

TEST(RlAsync, StalenessOneSamplesAheadAndCorrectsStaleBatches) {
  // NOTE [staleness]: iteration 1 is the synchronous one (nothing sampled
  // ahead yet); from iteration 2 every batch was sampled by the previous
  // weights and carries importance weights.
  test::temp_dir tmp;
  auto sync = parse_job(tiny_job(tmp.file("sync")), {"stages=[sft, rl]", "rl.iterations=4"});
  auto ahead = parse_job(tiny_job(tmp.file("ahead")),
                         {"stages=[sft, rl]", "rl.iterations=4", "rl.staleness=1"});
  ASSERT_TRUE(sync && ahead);
  auto a = run(*sync), b = run(*ahead);
  ASSERT_TRUE(a.summary) << describe(a.summary.error());
  ASSERT_TRUE(b.summary) << describe(b.summary.error());
  auto ra = stage_lines(a.metrics, "rl"), rb = stage_lines(b.metrics, "rl");
  ASSERT_EQ(ra.size(), 5u);
  ASSERT_EQ(rb.size(), 5u);
  for (int step = 1; step <= 4; ++step) {
    const auto& j = rb[static_cast<size_t>(step)];
    EXPECT_EQ(j["rollout/staleness"].get<double>(), step == 1 ? 0.0 : 1.0) << step;
    // The contract's metrics with staleness: against the newer weights.
    for (const char* key : {"rollout_corr/logprob_abs_diff_mean",
                            "rollout_corr/logprob_abs_diff_max", "rollout_corr/kl"})
      EXPECT_TRUE(j.contains(key)) << step << ": " << key;
    if (step > 1) {
      EXPECT_GT(j["rollout_corr/logprob_abs_diff_mean"].get<double>(), 1e-5)
          << step << ": a version apart";
    }
    EXPECT_EQ(j.contains("rollout/stale_is_weight/mean"), step > 1) << step;
    if (step > 1) {
      auto w = j["rollout/stale_is_weight/mean"].get<double>();
      EXPECT_GT(w, 0.5);
      EXPECT_LT(w, 2.0);
    }
  }
  // Iteration 1 is the same batch with the same weights either way.
  // (The engine's own counters differ: with staleness 1 it also samples
  // iteration 2's batch during iteration 1.)
  auto without_engine_work = [](nlohmann::json j) {
    for (const char* k : {"timing_s/gen_wait", "rollout/generated_tokens", "rollout/prefill_tokens",
                          "rollout/prefix_hit_rate", "rollout/kv_utilization",
                          "rollout/preemptions", "rollout/recomputed_tokens"})
      j.erase(k);
    for (auto it = j.begin(); it != j.end();) // the lags' metrics (NOTE [staleness])
      it = it.key().rfind("rollout/staleness", 0) == 0 ? j.erase(it) : std::next(it);
    return j;
  };
  EXPECT_EQ(without_engine_work(deterministic_part(ra[1])),
            without_engine_work(deterministic_part(rb[1])));
  // From iteration 2 the engine's log-probs are the previous weights': the
  // policy's differ from them far more than synchronously (numerics only).
  for (size_t step = 2; step <= 4; ++step)
    EXPECT_GT(rb[step]["rollout/logprob_diff"].get<double>(),
              10 * ra[step]["rollout/logprob_diff"].get<double>())
        << step;
}

// With staleness 2 and no in-flight updates the batches ahead are finished
// before each weight_sync: the batch of iteration j was sampled wholly by
// version max(j − 2, 0) — iteration 1 synchronously, 2 one version behind,
// from 3 on two — and the checkpoint holds both batches ahead.
TEST(RlAsync, StalenessTwoSamplesTwoBatchesAheadAndEveryTokenIsWithinTheBound) {
  test::temp_dir tmp;
  auto rl = rl_lines_of(tmp, {"rl.staleness=2"});
  ASSERT_EQ(rl.size(), 6u);
  for (int step = 1; step <= 5; ++step) {
    const auto& j = rl[static_cast<size_t>(step)];
    const double lag = std::min(step - 1, 2);
    EXPECT_EQ(j["rollout/staleness"].get<double>(), lag) << step;
    EXPECT_EQ(j["rollout/staleness/mean"].get<double>(), lag) << step;
    auto fr = lag_fractions(j, 2);
    EXPECT_EQ(fr[static_cast<size_t>(lag)], 1.0) << step;
    EXPECT_EQ(j.contains("rollout/stale_is_weight/mean"), lag > 0) << step;
    EXPECT_TRUE(j.contains("timing_s/gen_wait")) << step;
  }
  // A run stopped after iteration 3 checkpoints the batches of iterations
  // 4 and 5, sampled ahead.
  auto stopped =
      parse_job(tiny_job(tmp.file("stopped")),
                {"stages=[sft, rl]", "rl.iterations=5", "rl.staleness=2", "rl.checkpoint_every=0"});
  ASSERT_TRUE(stopped) << describe(stopped.error());
  std::atomic<bool> stop{false};
  auto partial = run(*stopped, stop_after_rl_step(stop, 3));
  ASSERT_TRUE(partial.summary) << describe(partial.summary.error());
  auto latest = runtime::latest_checkpoint(tmp.file("stopped") + "/rl/checkpoints");
  ASSERT_TRUE(latest) << describe(latest.error());
  auto files = runtime::read_checkpoint(*latest);
  ASSERT_TRUE(files) << describe(files.error());
  EXPECT_EQ(nlohmann::json::parse(files->at("driver.json"))["iteration"].get<int64_t>(), 3);
  EXPECT_TRUE(files->count("ahead_batches.bin"));
  // Resumed with a lower bound, the batch for iteration 4 (sampled two
  // versions before it) would break it: refused with the reason, nothing
  // trained.
  auto lowered =
      parse_job(tiny_job(tmp.file("stopped")),
                {"stages=[sft, rl]", "rl.iterations=5", "rl.staleness=1", "rl.checkpoint_every=0"});
  ASSERT_TRUE(lowered) << describe(lowered.error());
  run_options again;
  again.resume = true;
  auto refused = run(*lowered, again);
  ASSERT_FALSE(refused.summary);
  EXPECT_NE(describe(refused.summary.error())
                .find("the batch sampled ahead for iteration 4 was sampled 2 versions behind "
                      "it, beyond rl.staleness 1"),
            std::string::npos)
      << describe(refused.summary.error());
}

// In-flight updates: no gen_wait; the rollout takes each version as it
// arrives, so a batch may mix versions — never older than the bound.
TEST(RlAsync, InflightUpdatesKeepEveryTokenWithinTheBound) {
  test::temp_dir tmp;
  auto rl = rl_lines_of(
      tmp, {"rl.staleness=2", "rl.inflight_updates=true", "rl.generation.max_tokens=12"});
  ASSERT_EQ(rl.size(), 6u);
  for (int step = 1; step <= 5; ++step) {
    const auto& j = rl[static_cast<size_t>(step)];
    EXPECT_FALSE(j.contains("timing_s/gen_wait")) << step;
    EXPECT_LE(j["rollout/staleness/max"].get<double>(), std::min(step - 1, 2)) << step;
    double sum = 0;
    for (double f : lag_fractions(j, 2))
      sum += f;
    EXPECT_NEAR(sum, 1.0, 1e-9) << step;
    if (j.contains("rollout/stale_is_weight/capped")) { // capped at stale_is_cap (2)
      EXPECT_GE(j["rollout/stale_is_weight/capped"].get<double>(), 0.0);
      EXPECT_LE(j["rollout/stale_is_weight/capped"].get<double>(), 1.0);
      EXPECT_GT(j["rollout/stale_is_weight/mean"].get<double>(), 0.0);
      EXPECT_LE(j["rollout/stale_is_weight/mean"].get<double>(), 2.0);
    }
    EXPECT_TRUE(std::isfinite(j["actor/pg_loss"].get<double>())) << step;
  }
  EXPECT_EQ(rl[1]["rollout/staleness/max"].get<double>(), 0.0) << "the first batch is synchronous";
}

// NOTE [staleness]: the checkpoint holds both batches sampled ahead.
TEST(RlAsync, StalenessTwoResumesExactly) {
  expect_resume_continues_exactly({"rl.iterations=5", "rl.checkpoint_every=0", "rl.staleness=2"});
}

TEST(RlAsync, ANegativeBoundIsRefused) {
  test::temp_dir tmp;
  auto bad = parse_job(tiny_job(tmp.file("bad")), {"rl.staleness=-1"});
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("rl.staleness: must be >= 0"), std::string::npos)
      << describe(bad.error());
}

namespace {

const std::vector<std::string> paced_inflight{"rl.staleness=2", "rl.inflight_updates=true",
                                              "rl.inflight_steps=3", "rl.generation.max_tokens=12",
                                              "rl.rollout.batch_invariant=true"};

std::vector<std::string> with_paced(std::vector<std::string> sets) {
  sets.insert(sets.end(), paced_inflight.begin(), paced_inflight.end());
  return sets;
}

} // namespace

// NOTE [paced rollout]: at a pace of 3 steps the batches ahead take each
// version at a point the messages fix, so they mix versions the same way
// in every run; a run stopped after iteration 2 checkpoints the rollout's
// batches mid-generation (rollout_ahead.bin: tokens, versions, random
// streams, K/V) and nothing it had collected.
TEST(RlAsync, PacedInflightUpdatesMixVersionsAndCheckpointTheRolloutsBatches) {
  test::temp_dir tmp;
  auto rl = rl_lines_of(tmp, with_paced({}));
  ASSERT_EQ(rl.size(), 6u);
  bool mixed = false;
  for (int step = 1; step <= 5; ++step) {
    const auto& j = rl[static_cast<size_t>(step)];
    EXPECT_LE(j["rollout/staleness/max"].get<double>(), std::min(step - 1, 2)) << step;
    auto fr = lag_fractions(j, 2);
    mixed = mixed || (fr[0] > 0 && fr[0] < 1) || (fr[1] > 0 && fr[1] < 1);
  }
  EXPECT_TRUE(mixed) << "a batch ahead spans a version switch";
  auto stopped =
      parse_job(tiny_job(tmp.file("stopped")),
                with_paced({"stages=[sft, rl]", "rl.iterations=5", "rl.checkpoint_every=0"}));
  ASSERT_TRUE(stopped) << describe(stopped.error());
  std::atomic<bool> stop{false};
  auto partial = run(*stopped, stop_after_rl_step(stop, 2));
  ASSERT_TRUE(partial.summary) << describe(partial.summary.error());
  auto latest = runtime::latest_checkpoint(tmp.file("stopped") + "/rl/checkpoints");
  ASSERT_TRUE(latest) << describe(latest.error());
  auto files = runtime::read_checkpoint(*latest);
  ASSERT_TRUE(files) << describe(files.error());
  EXPECT_TRUE(files->count("rollout_ahead.bin"));
  EXPECT_FALSE(files->count("ahead_batches.bin")) << "every batch ahead is in the rollout";
  // Resumed without in-flight updates, the rollout's batches are refused.
  auto off = parse_job(tiny_job(tmp.file("stopped")),
                       {"stages=[sft, rl]", "rl.iterations=5", "rl.checkpoint_every=0",
                        "rl.staleness=2", "rl.generation.max_tokens=12"});
  ASSERT_TRUE(off);
  run_options again;
  again.resume = true;
  auto refused = run(*off, again);
  ASSERT_FALSE(refused.summary);
  EXPECT_NE(describe(refused.summary.error()).find("resume with it on"), std::string::npos)
      << describe(refused.summary.error());
}

// NOTE [paced rollout]: staleness 2 with paced in-flight updates, stopped
// after iteration 2 and resumed, is the uninterrupted run: metric for
// metric, and the final weights bit for bit.
TEST(RlAsync, PacedInflightUpdatesWithStalenessTwoResumeExactly) {
  expect_resume_continues_exactly(with_paced({"rl.iterations=5", "rl.checkpoint_every=0"}));
}

TEST(RlAsync, InflightStepsPaceInflightUpdatesOfAOneRankRollout) {
  test::temp_dir tmp;
  auto expect_refused = [&](const std::string& yaml, std::vector<std::string> sets,
                            const std::string& why) {
    auto bad = parse_job(yaml, std::move(sets));
    ASSERT_FALSE(bad) << why;
    EXPECT_NE(describe(bad.error()).find(why), std::string::npos) << describe(bad.error());
  };
  expect_refused(tiny_job(tmp.file("a")), {"rl.staleness=1", "rl.inflight_steps=2"},
                 "rl.inflight_steps: paces in-flight updates: needs rl.inflight_updates true");
  expect_refused(tiny_job(tmp.file("b")),
                 {"rl.staleness=1", "rl.inflight_updates=true", "rl.inflight_steps=-1"},
                 "rl.inflight_steps: must be >= 0");
  expect_refused(tiny_job(tmp.file("c")) + "placement:\n  roles: [{role: rollout, tp: 2}]\n",
                 {"rl.staleness=1", "rl.inflight_updates=true", "rl.inflight_steps=2"},
                 "paced in-flight updates need the rollout's tp 1");
}

// Unpaced in-flight updates checkpoint the rollout's batches as they are
// (nothing is waited for, no sample lost): the resumed run takes them back
// and finishes, every token within the bound.
TEST(RlAsync, UnpacedInflightUpdatesResumeWithTheRolloutsBatches) {
  test::temp_dir tmp;
  const std::vector<std::string> sets{"stages=[sft, rl]",         "rl.iterations=5",
                                      "rl.checkpoint_every=0",    "rl.staleness=2",
                                      "rl.inflight_updates=true", "rl.generation.max_tokens=12"};
  auto cfg = parse_job(tiny_job(tmp.file("run")), sets);
  ASSERT_TRUE(cfg) << describe(cfg.error());
  std::atomic<bool> stop{false};
  auto first = run(*cfg, stop_after_rl_step(stop, 2));
  ASSERT_TRUE(first.summary) << describe(first.summary.error());
  auto files = runtime::read_checkpoint(
      runtime::latest_checkpoint(tmp.file("run") + "/rl/checkpoints").value());
  ASSERT_TRUE(files && files->count("rollout_ahead.bin"));
  run_options again;
  again.resume = true;
  auto second = run(*cfg, again);
  ASSERT_TRUE(second.summary) << describe(second.summary.error());
  EXPECT_FALSE(second.summary->stopped);
  auto rl = stage_lines(second.metrics, "rl");
  ASSERT_EQ(rl.size(), 6u);
  for (int step = 3; step <= 5; ++step)
    EXPECT_LE(rl[static_cast<size_t>(step)]["rollout/staleness/max"].get<double>(), 2.0) << step;
}
