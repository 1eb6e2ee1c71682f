// NOTE [supervision]: the restart policy's limits (per role in a sliding
// window, the job's budget, the roles' defaults), the job file's checks,
// and whole jobs in one process whose roles are killed (NOTE [kill
// injection]): a lost rollout, reference or reward restarts and the run
// ends exactly where an uninterrupted one does; a lost trainer, or a loss
// past the budget, fails the job naming every restart.
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

// The metrics lines without the wall-clock ones.
std::vector<nlohmann::json> deterministic(const std::vector<nlohmann::json>& lines) {
  std::vector<nlohmann::json> out;
  for (const auto& l : lines)
    out.push_back(deterministic_part(l));
  return out;
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
           {"supervision: {roles: [{role: policy, max_restarts: 2}]}\n",
            "supervision.roles[0].max_restarts"},
           {"debug: {kills: [{role: rollout, iteration: 0}]}\n", "debug.kills[0].iteration"},
           {"debug: {kills: [{role: rollout, iteration: 1, phase: genn}]}\n",
            "debug.kills[0].phase"},
           {"debug: {kills: [{role: rollout, iteration: 1, rank: 1}]}\n", "debug.kills[0].rank"},
           {"debug: {kills: [{role: nobody, iteration: 1}]}\n", "debug.kills[0].role"},
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
}

// NOTE [kill injection]: in one process a killed role's actor ends while it
// holds its request; its proxy fails the request as lost, the role is
// built again, and the phase runs again with the same requests and seeds.
TEST(SupervisionInProcess, KilledRolloutReferenceAndRewardRecoverAndEndAsAnUninterruptedRun) {
  test::temp_dir tmp;
  const std::vector<std::string> sets = {
      "stages=[sft, rl]", "rl.eval_every=0",
      "supervision.roles=[{role: rollout, backoff_ms: 0}, "
      "{role: reference, backoff_ms: 0}, {role: reward, backoff_ms: 0}]"};
  auto plain = parse(tiny_job(tmp.file("plain")), sets);
  ASSERT_TRUE(plain) << describe(plain.error());
  auto want = run(*plain);
  ASSERT_TRUE(want.summary) << describe(want.summary.error());
  auto kills = sets;
  kills.push_back("debug.kills=[{role: rollout, iteration: 2, phase: gen}, "
                  "{role: reference, iteration: 2, phase: ref}, "
                  "{role: reward, iteration: 3, phase: reward}, "
                  "{role: rollout, iteration: 3, phase: weight_sync}]");
  auto killed = parse(tiny_job(tmp.file("killed")), kills);
  ASSERT_TRUE(killed) << describe(killed.error());
  auto got = run(*killed);
  ASSERT_TRUE(got.summary) << describe(got.summary.error());
  EXPECT_EQ(deterministic(got.metrics), deterministic(want.metrics));
  // Each loss: restarting then restarted, with its attempt and time.
  auto roles = events_of(killed->run.dir, "role");
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
