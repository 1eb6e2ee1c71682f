// NOTE [supervision]: the restart policy's limits (per role in a sliding
// window, the job's budget, the roles' defaults), the job file's checks,
// and whole jobs in one process whose roles are killed (NOTE [kill
// injection]): a lost rollout, reference or reward restarts and the run
// ends exactly where an uninterrupted one does; a lost trainer, or a loss
// past the budget, fails the job naming every restart.
#include "actors/rl/roles.hpp"
#include "actors/rl/supervision.hpp"
#include "tests/actors/job_runs.hpp"
#include "tests/actors/job_yaml.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>

using namespace troupe;
using namespace troupe::actors::rl;
using namespace troupe::actors::rl::testing;

namespace {

caf::error loss(const std::string& what) {
  return make_error(errc::lost, what + " went down");
}

expected<job_config> parse(const std::string& yaml, const std::vector<std::string>& sets = {}) {
  return parse_job(yaml, sets);
}

// Both trainers as two DP ranks (`extra` added to their entries), every
// role in one pool of two devices.
std::string two_dp_ranks(const std::string& extra) {
  return "placement:\n"
         "  mode: colocated\n"
         "  pools: [{name: all, devices: 2}]\n"
         "  roles:\n"
         "    - {role: policy, pool: all, dp: 2" +
         extra +
         "}\n"
         "    - {role: critic, pool: all, dp: 2" +
         extra + "}\n";
}

// Runs the tiny job with `extra` and `sets` twice, each in this process on
// its own host: as is, and with debug.kills=`kills`; the killed run must
// end as the other (its metrics but the wall-clock ones, its final
// weights). Answers the killed run's run directory ("" when it failed).
std::string killed_ends_as_plain(const test::temp_dir& tmp, const std::string& extra,
                                 std::vector<std::string> sets, const std::string& kills) {
  actors::rl::in_process_host host_a, host_b;
  run_options on_a, on_b;
  on_a.host = &host_a;
  on_b.host = &host_b;
  auto plain = parse_job(tiny_job(tmp.file("plain")) + extra, sets);
  EXPECT_TRUE(plain) << describe(plain.error());
  if (!plain)
    return "";
  auto want = run(*plain, on_a);
  EXPECT_TRUE(want.summary) << describe(want.summary.error());
  sets.push_back("debug.kills=" + kills);
  auto killed = parse_job(tiny_job(tmp.file("killed")) + extra, sets);
  EXPECT_TRUE(killed) << describe(killed.error());
  if (!killed || !want.summary)
    return "";
  auto got = run(*killed, on_b);
  EXPECT_TRUE(got.summary) << describe(got.summary.error());
  if (!got.summary)
    return "";
  EXPECT_EQ(got.metrics.size(), want.metrics.size());
  for (size_t i = 0; i < std::min(got.metrics.size(), want.metrics.size()); ++i)
    EXPECT_EQ(deterministic_part(got.metrics[i]), deterministic_part(want.metrics[i]))
        << "line " << i;
  expect_same_final_weights(plain->run.dir, killed->run.dir);
  return killed->run.dir;
}

} // namespace

TEST(RestartPolicy, RolesTakeTheirDefaultsAndTheirEntries) {
  supervision_config c;
  c.roles.push_back({"reward", 1, 30, 0});
  troupe::actors::rl::detail::restart_policy p{c};
  EXPECT_EQ(p.limits(role_id::rollout).max_restarts, 3);
  EXPECT_EQ(p.limits(role_id::reference).max_restarts, 3);
  EXPECT_EQ(p.limits(role_id::policy).max_restarts, 0);
  EXPECT_EQ(p.limits(role_id::critic).max_restarts, 0);
  EXPECT_EQ(p.limits(role_id::reward).max_restarts, 1);
  EXPECT_EQ(p.limits(role_id::reward).window_s, 30);
  EXPECT_EQ(p.limits(role_id::rollout).backoff_ms, 200);
}

TEST(RestartPolicy, CountsRestartsInTheWindowAndTheBudget) {
  supervision_config c;
  c.budget = 4;
  c.roles.push_back({"rollout", 2, 10, 0});
  troupe::actors::rl::detail::restart_policy p{c};
  auto a = p.admit(role_id::rollout, 0, 1, "gen", loss("rollout"));
  ASSERT_TRUE(a) << describe(a.error());
  EXPECT_EQ(a->attempt, 1);
  p.recovered(0.5);
  auto b = p.admit(role_id::rollout, 5, 2, "gen", loss("rollout"));
  ASSERT_TRUE(b);
  EXPECT_EQ(b->attempt, 2);
  // A third within 10 s of the first two: refused, naming the limit and both.
  auto c3 = p.admit(role_id::rollout, 9, 3, "evaluate", loss("rollout"));
  ASSERT_FALSE(c3);
  EXPECT_EQ(code_of(c3.error()), errc::lost);
  auto msg = describe(c3.error());
  EXPECT_NE(msg.find("max_restarts 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rollout #1 in iteration 1, gen (recovered in 0.50 s)"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find("rollout #2 in iteration 2, gen (not recovered)"), std::string::npos) << msg;
  // The window slides: 10 s after the first, one more fits.
  auto d = p.admit(role_id::rollout, 10.5, 3, "gen", loss("rollout"));
  ASSERT_TRUE(d) << describe(d.error());
  EXPECT_EQ(d->attempt, 3);
  ASSERT_TRUE(p.admit(role_id::reference, 11, 3, "ref", loss("reference")));
  // The budget of 4 is spent.
  auto e = p.admit(role_id::reward, 12, 3, "reward", loss("reward"));
  ASSERT_FALSE(e);
  EXPECT_NE(describe(e.error()).find("supervision.budget 4"), std::string::npos);
  EXPECT_EQ(p.history().size(), 4u);
}

TEST(RestartPolicy, ATrainerIsNotRestarted) {
  troupe::actors::rl::detail::restart_policy p{supervision_config{}};
  auto r = p.admit(role_id::policy, 0, 1, "update_actor", loss("policy"));
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("policy is not restarted"), std::string::npos);
  EXPECT_NE(describe(r.error()).find("policy went down"), std::string::npos);
}

TEST(SupervisionConfig, BadEntriesAreRefusedWithTheirPath) {
  test::temp_dir tmp;
  const std::string dp2 = two_dp_ranks("");
  const std::string zero1 = two_dp_ranks(", strategy: zero1");
  struct bad {
    std::string yaml;
    std::string path;
  };
  for (const auto& b : std::vector<bad>{
           {"supervision: {budget: -1}\n", "supervision.budget"},
           {"supervision: {roles: [{role: rollot}]}\n", "supervision.roles[0].role"},
           {"supervision: {roles: [{role: reward}, {role: reward}]}\n",
            "supervision.roles[1].role"},
           {"supervision: {roles: [{role: reward, window_s: 0}]}\n",
            "supervision.roles[0].window_s"},
           {"supervision: {roles: [{role: reward, backoff_ms: -5}]}\n",
            "supervision.roles[0].backoff_ms"},
           {"supervision: {roles: [{role: policy, max_restarts: -2}]}\n",
            "supervision.roles[0].max_restarts"},
           {dp2 + "debug: {kills: [{role: policy, iteration: 1, phase: old_log_prob, "
                  "collective: 1}]}\n",
            "debug.kills[0].collective"},
           {"debug: {kills: [{role: critic, iteration: 1, phase: update_critic, "
            "collective: 1}]}\n",
            "debug.kills[0].collective"},
           {"debug: {kills: [{role: rollout, iteration: 0}]}\n", "debug.kills[0].iteration"},
           {"debug: {kills: [{role: rollout, iteration: 1, phase: genn}]}\n",
            "debug.kills[0].phase"},
           {"debug: {kills: [{role: rollout, iteration: 1, phase: checkpoint}]}\n",
            "debug.kills[0].phase"},
           {"debug: {kills: [{role: rollout, iteration: 1, rank: 1}]}\n", "debug.kills[0].rank"},
           {"debug: {kills: [{role: nobody, iteration: 1}]}\n", "debug.kills[0].role"},
           // A hang is inside a collective, of a rank in a worker, watched by heartbeats.
           {dp2 +
                "debug: {kills: [{role: policy, iteration: 1, phase: update_actor, how: hang}]}\n",
            "debug.kills[0].how"},
           {dp2 + "supervision: {heartbeat_s: 0}\n"
                  "debug: {kills: [{role: policy, iteration: 1, phase: update_actor, "
                  "collective: 1, how: hang}]}\n",
            "debug.kills[0].how"},
           {"placement:\n  mode: in_process\n  roles: [{role: policy, dp: 2}]\n"
            "debug: {kills: [{role: policy, iteration: 1, phase: update_actor, collective: 1, "
            "how: hang}]}\n",
            "debug.kills[0].how"},
           {dp2 + "debug: {kills: [{role: policy, iteration: 1, phase: update_actor, "
                  "collective: 1, how: freeze}]}\n",
            "debug.kills[0].how"},
       }) {
    auto cfg = parse(tiny_job(tmp.file("run")) + b.yaml);
    ASSERT_FALSE(cfg) << b.yaml;
    EXPECT_NE(describe(cfg.error()).find(b.path), std::string::npos)
        << b.yaml << describe(cfg.error());
  }
  auto fine = parse(tiny_job(tmp.file("run")) +
                    "supervision: {budget: 2, roles: [{role: policy, max_restarts: 0}, "
                    "{role: rollout, max_restarts: 1, window_s: 60, backoff_ms: 0}]}\n"
                    "debug: {kills: [{role: reference, iteration: 2, phase: ref}]}\n");
  EXPECT_TRUE(fine) << describe(fine.error());
  auto hang = parse(tiny_job(tmp.file("run")) + dp2 +
                    "debug: {kills: [{role: policy, iteration: 1, phase: update_actor, "
                    "collective: 2, how: hang}]}\n");
  ASSERT_TRUE(hang) << describe(hang.error());
  EXPECT_EQ(hang->debug.kills.at(0).how, kill_how::hang);
  // A trainer restarts from a DP peer (ddp) or by a rollback (any layout).
  for (const auto& layout : {std::string{}, dp2, zero1}) {
    auto trainers = parse(tiny_job(tmp.file("run")) + layout +
                          "supervision: {roles: [{role: policy, max_restarts: 1}]}\n");
    EXPECT_TRUE(trainers) << layout << describe(trainers.error());
  }
  auto collective = parse(tiny_job(tmp.file("run")) + dp2 +
                          "debug: {kills: [{role: policy, iteration: 2, phase: update_actor, "
                          "rank: 1, collective: 2}]}\n");
  EXPECT_TRUE(collective) << describe(collective.error());
}

// NOTE [kill injection]: in one process a killed role's actor ends while it
// holds its request; its proxy fails the request as lost, the role is
// built again, and the phase runs again with the same requests and seeds.
TEST(SupervisionInProcess, KilledRolloutReferenceAndRewardRecoverAndEndAsAnUninterruptedRun) {
  test::temp_dir tmp;
  auto dir =
      killed_ends_as_plain(tmp, "",
                           {"stages=[sft, rl]", "rl.eval_every=0",
                            "supervision.roles=[{role: rollout, backoff_ms: 0}, "
                            "{role: reference, backoff_ms: 0}, {role: reward, backoff_ms: 0}]"},
                           "[{role: rollout, iteration: 2, phase: gen}, "
                           "{role: reference, iteration: 2, phase: ref}, "
                           "{role: reward, iteration: 3, phase: reward}, "
                           "{role: rollout, iteration: 3, phase: weight_sync}]");
  ASSERT_FALSE(dir.empty());
  // Each loss: restarting then restarted, with its attempt and time.
  auto roles = events_of(dir, "role");
  std::vector<std::string> seen;
  for (const auto& e : roles) {
    auto status = e.at("status").get<std::string>();
    if (status != "restarting" && status != "restarted")
      continue;
    seen.push_back(e.at("role").get<std::string>() + " " + status + " " +
                   e.at("phase").get<std::string>() + " #" +
                   std::to_string(e.at("attempt").get<int>()));
    if (status == "restarted") {
      EXPECT_GT(e.at("recover_s").get<double>(), 0) << e.dump();
      EXPECT_LT(e.at("recover_s").get<double>(), 10) << e.dump();
    } else {
      EXPECT_NE(e.at("reason").get<std::string>().find("lost"), std::string::npos) << e.dump();
    }
  }
  EXPECT_EQ(seen, (std::vector<std::string>{
                      "rollout restarting gen #1", "rollout restarted gen #1",
                      "reference restarting ref #1", "reference restarted ref #1",
                      "reward restarting reward #1", "reward restarted reward #1",
                      "rollout restarting weight_sync #2", "rollout restarted weight_sync #2"}));
}

TEST(SupervisionInProcess, PastTheBudgetTheJobFailsListingEveryRestart) {
  test::temp_dir tmp;
  auto cfg = parse(tiny_job(tmp.file("run")),
                   {"stages=[sft, rl]", "rl.eval_every=0", "supervision.budget=1",
                    "debug.kills=[{role: rollout, iteration: 1, phase: gen}, "
                    "{role: reference, iteration: 2, phase: ref}]"});
  ASSERT_TRUE(cfg) << describe(cfg.error());
  auto r = run(*cfg);
  ASSERT_FALSE(r.summary);
  auto msg = describe(r.summary.error());
  EXPECT_NE(msg.find("rl iteration 2, phase ref"), std::string::npos) << msg;
  EXPECT_NE(msg.find("supervision.budget 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("restarts so far: rollout #1 in iteration 1, gen (recovered in"),
            std::string::npos)
      << msg;
  // The last events name the failed role; the rollout's restart is in them.
  int restarted = 0, failed = 0;
  for (const auto& e : events_of(cfg->run.dir, "role")) {
    restarted += e.at("status") == "restarted" && e.at("role") == "rollout";
    failed += e.at("status") == "failed" && e.at("role") == "reference";
  }
  EXPECT_EQ(restarted, 1);
  EXPECT_EQ(failed, 1);
}

TEST(SupervisionInProcess, ALostTrainerFailsTheJobAsBefore) {
  test::temp_dir tmp;
  auto cfg = parse(tiny_job(tmp.file("run")),
                   {"stages=[sft, rl]", "rl.eval_every=0",
                    "debug.kills=[{role: critic, iteration: 2, phase: values}]"});
  ASSERT_TRUE(cfg) << describe(cfg.error());
  auto r = run(*cfg);
  ASSERT_FALSE(r.summary);
  auto msg = describe(r.summary.error());
  EXPECT_EQ(code_of(r.summary.error()), errc::lost) << msg;
  EXPECT_NE(msg.find("critic is not restarted"), std::string::npos) << msg;
  EXPECT_EQ(stage_lines(r.metrics, "rl").size(), 2u); // step 0 and iteration 1
}

// NOTE [peer state]: a lost DP rank of a trainer — the policy's inside a
// collective of its update (so the surviving rank may have stepped part
// of it), the critic's while it saves its state for a checkpoint and at a
// request, the policy's again while it publishes — restarts from a
// surviving rank's state; the run's metrics and final weights equal the
// uninterrupted run's.
TEST(SupervisionInProcess, LostTrainerDpRanksRestartFromTheirPeersAndEndAsAnUninterruptedRun) {
  test::temp_dir tmp;
  auto dir = killed_ends_as_plain(
      tmp, two_dp_ranks(""),
      {"stages=[sft, rl]", "rl.eval_every=0",
       "supervision.roles=[{role: policy, max_restarts: 2, backoff_ms: 0}, "
       "{role: critic, max_restarts: 2, backoff_ms: 0}]"},
      "[{role: policy, iteration: 2, phase: update_actor, rank: 1, collective: 3}, "
      "{role: critic, iteration: 2, phase: checkpoint, rank: 1}, "
      "{role: critic, iteration: 3, phase: values, rank: 0}, "
      "{role: policy, iteration: 3, phase: weight_sync, rank: 0}]");
  ASSERT_FALSE(dir.empty());
  std::vector<std::string> seen;
  for (const auto& e : events_of(dir, "role")) {
    if (e.at("status") != "restarted" || e.at("rank") != 0)
      continue;
    seen.push_back(e.at("role").get<std::string>() + " " + e.at("phase").get<std::string>() + " #" +
                   std::to_string(e.at("attempt").get<int>()));
    EXPECT_LT(e.at("recover_s").get<double>(), 30) << e.dump();
  }
  EXPECT_EQ(seen, (std::vector<std::string>{"policy update_actor #1", "critic checkpoint #1",
                                            "critic values #2", "policy weight_sync #2"}));
}

// NOTE [rollback]: a single-rank trainer has no peer to restore it from:
// the rl stage runs again from its last checkpoint (the policy lost in
// iteration 4's update, checkpoints every 2 iterations: back to the one of
// iteration 2) or from its start (the critic lost in iteration 1, before
// any checkpoint); the iterations since are trained again, metrics.jsonl
// holds each step once, and the run ends as the uninterrupted one.
TEST(SupervisionInProcess, ALostSingleRankTrainerRollsTheStageBackAndEndsAsAnUninterruptedRun) {
  test::temp_dir tmp;
  auto dir = killed_ends_as_plain(
      tmp, "",
      {"stages=[sft, rl]", "rl.eval_every=0", "rl.iterations=5", "rl.checkpoint_every=2",
       "supervision.roles=[{role: policy, max_restarts: 1, backoff_ms: 0}, "
       "{role: critic, max_restarts: 1, backoff_ms: 0}]"},
      "[{role: critic, iteration: 1, phase: update_critic}, "
      "{role: policy, iteration: 4, phase: update_actor}]");
  ASSERT_FALSE(dir.empty());
  std::vector<std::string> seen;
  for (const auto& e : events_of(dir, "role"))
    if (e.at("status") == "restarted")
      seen.push_back(e.at("role").get<std::string>() + ": " + e.at("reason").get<std::string>());
  EXPECT_EQ(seen, (std::vector<std::string>{
                      "critic: rolled back to the rl stage's start; the iterations since run again",
                      "policy: rolled back to the checkpoint of iteration 2; the iterations since "
                      "run again"}));
}

// NOTE [rollback] under ZeRO: the lost rank held the only copy of its
// shard of the optimizer state, so a policy rank killed inside a
// collective of its update rolls the stage back to the last checkpoint.
TEST(SupervisionInProcess, ALostZeroRankRollsTheStageBackAndEndsAsAnUninterruptedRun) {
  test::temp_dir tmp;
  auto dir = killed_ends_as_plain(
      tmp, two_dp_ranks(", strategy: zero1"),
      {"stages=[sft, rl]", "rl.eval_every=0", "rl.iterations=4", "rl.checkpoint_every=2",
       "supervision.roles=[{role: policy, max_restarts: 1, backoff_ms: 0}]"},
      "[{role: policy, iteration: 3, phase: update_actor, rank: 0, collective: 2}]");
  ASSERT_FALSE(dir.empty());
  int rolled = 0;
  for (const auto& e : events_of(dir, "role"))
    rolled += e.at("status") == "restarted" && e.at("rank") == 0 &&
              e.at("reason") == "rolled back to the checkpoint of iteration 2; the iterations "
                                "since run again";
  EXPECT_EQ(rolled, 1);
}

// NOTE [rollback] for a rollout: with a batch generated ahead
// (rl.staleness 1), the rollout is asked for it after the policy's update
// began (gen_wait). A broadcast channel keeps no copy of the version the
// lost rollout generated with, and the policy has moved on: the stage rolls
// back to its last checkpoint instead of failing, and ends as the
// uninterrupted run.
TEST(SupervisionInProcess, ARolloutFedByBroadcastLostDuringTheUpdateRollsTheStageBack) {
  test::temp_dir tmp;
  auto dir = killed_ends_as_plain(tmp, "",
                                  {"stages=[sft, rl]", "rl.eval_every=0", "rl.iterations=4",
                                   "rl.checkpoint_every=2", "rl.staleness=1",
                                   "weight_sync.transport=broadcast",
                                   "supervision.roles=[{role: rollout, backoff_ms: 0}]"},
                                  "[{role: rollout, iteration: 3, phase: update_actor}]");
  ASSERT_FALSE(dir.empty());
  std::vector<std::string> seen;
  for (const auto& e : events_of(dir, "role"))
    if (e.at("status") == "restarted" || e.at("status") == "restarting")
      seen.push_back(e.at("role").get<std::string>() + " " + e.at("status").get<std::string>() +
                     " in " + e.at("phase").get<std::string>());
  EXPECT_EQ(seen, (std::vector<std::string>{"rollout restarting in gen_wait",
                                            "rollout restarted in gen_wait"}));
  bool rolled = false;
  for (const auto& e : events_of(dir, "role"))
    rolled = rolled || (e.at("status") == "restarted" &&
                        e.at("reason") == "rolled back to the checkpoint of iteration 2; the "
                                          "iterations since run again");
  EXPECT_TRUE(rolled);
}
