// The cast and the stage table (NOTE [the cast], NOTE [stage table]): the
// roles each stage uses, in order; a cast built on a fake role host whose
// roles are stub actors that log what they are asked — spawn order and the
// role events, release after each RL phase, fault injection, replacing a
// rank, stopping — without any model.
#include "actors/actor_system.hpp"
#include "actors/rl/cast.hpp"
#include "actors/rl/job.hpp"
#include "actors/rl/stage_table.hpp"
#include "actors/train/engine_actor.hpp"
#include "actors/weight_channel.hpp"
#include "tests/actors/job_yaml.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>

#include <mutex>

using namespace troupe;
using namespace troupe::actors::rl;
namespace rld = troupe::actors::rl::detail;
namespace job_events = troupe::actors::job;

namespace {

/// What the stub roles were asked, in order ("policy: release <dir>").
struct message_log {
  std::mutex m;
  std::vector<std::string> lines;
  void add(std::string s) {
    std::lock_guard g{m};
    lines.push_back(std::move(s));
  }
  std::vector<std::string> take() {
    std::lock_guard g{m};
    return std::exchange(lines, {});
  }
};

/// A role that answers release (the rollout's form and the trainers') and
/// logs it, and logs fault injection.
caf::behavior stub(caf::event_based_actor*, std::string name, std::shared_ptr<message_log> log) {
  return {
      [=](troupe::actors::release_atom) -> int64_t {
        log->add(name + ": release");
        return 100;
      },
      [=](troupe::actors::release_atom,
          const std::string& dir) -> troupe::actors::train::served_bytes {
        log->add(name + ": release " + dir);
        return {1000, 0.5};
      },
      [=](troupe::actors::train::inject_failure_atom) { log->add(name + ": inject"); },
  };
}

/// Builds every rank of a role as a stub, and logs the specs it was given.
class fake_host final : public role_host {
public:
  explicit fake_host(std::shared_ptr<message_log> log) : log_(std::move(log)) {}
  expected<std::vector<caf::actor>> spawn(caf::actor_system& sys, const role_spec& spec) override {
    specs.push_back(spec);
    if (spec.role == fail_role)
      return make_error(errc::unavailable, "no worker for " + spec.role);
    std::vector<caf::actor> out;
    for (int32_t r = 0; r < spec.layout.ranks(); ++r)
      out.push_back(sys.spawn(
          stub, spec.role + (spec.layout.ranks() > 1 ? "/" + std::to_string(r) : ""), log_));
    return out;
  }
  expected<void> revive(const role_spec& spec) override {
    revived.push_back(spec.role + " " + spec.group_name);
    return {};
  }
  std::vector<role_spec> specs;
  std::vector<std::string> revived;
  std::string fail_role;

private:
  std::shared_ptr<message_log> log_;
};

struct fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<caf::scoped_actor> self;
  std::shared_ptr<message_log> log = std::make_shared<message_log>();
  fake_host host{log};
  std::vector<job_events::event_body> events;

  fixture() {
    troupe::actors::configure(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
    self = std::make_unique<caf::scoped_actor>(*sys);
  }

  rld::cast make(stage_id stage, std::function<int32_t(role_id)> dp = {}) {
    rld::cast_env env;
    env.sys = sys.get();
    env.self = self->ptr();
    env.host = &host;
    env.job_yaml = "run: {}\n";
    env.layout_of = [dp](role_id r) { return parallel_layout{dp ? dp(r) : 1, 1, 1}; };
    env.emit = [this](job_events::event_body e) { events.push_back(std::move(e)); };
    env.control_timeout = std::chrono::seconds(10);
    env.state_timeout = std::chrono::seconds(10);
    env.offload_dir = "offload";
    return rld::cast{std::move(env), stage};
  }

  /// Waits (bounded) until `a` has ended.
  bool ended(const caf::actor& a) {
    bool down = false;
    (*self)->monitor(a);
    (*self)->receive([&](caf::down_msg&) { down = true; },
                     caf::after(std::chrono::seconds(10)) >> [] {});
    return down;
  }
};

job_config job_of(std::vector<std::string> sets = {}) {
  auto c = troupe::actors::rl::testing::parse_job("", std::move(sets));
  EXPECT_TRUE(c) << describe(c.error());
  return c ? *c : job_config{};
}

std::vector<std::string> names(const std::vector<role_id>& roles) {
  std::vector<std::string> out;
  for (auto r : roles)
    out.emplace_back(to_string(r));
  return out;
}

using strings = std::vector<std::string>;

} // namespace

TEST(StageTable, EachStageIsARowWithItsCastInSpawnOrder) {
  EXPECT_EQ(all_stages().size(), enum_count<stage_id>());
  for (size_t i = 0; i < all_stages().size(); ++i) {
    const auto& st = all_stages()[i];
    EXPECT_EQ(static_cast<size_t>(st.id), i);
    EXPECT_EQ(st.name, to_string(st.id));
    EXPECT_EQ(find_stage(st.name), &st);
    EXPECT_TRUE(st.cast != nullptr && st.dp_rows != nullptr && st.seed != nullptr &&
                st.optim != nullptr)
        << st.name;
  }
  EXPECT_EQ(find_stage("ppo"), nullptr);
  auto ppo = job_of();
  EXPECT_EQ(names(stage_cast(stage_id::sft, ppo)), (strings{"policy", "rollout"}));
  EXPECT_EQ(names(stage_cast(stage_id::rm, ppo)), (strings{"reward"}));
  // dpo trains the policy against a frozen reference; no generation.
  EXPECT_EQ(names(stage_cast(stage_id::dpo, ppo)), (strings{"policy", "reference"}));
  EXPECT_TRUE(traits_of(role_id::policy).trains_in(stage_id::dpo));
  EXPECT_FALSE(traits_of(role_id::reference).trains_in(stage_id::dpo));
  EXPECT_EQ(names(stage_cast(stage_id::rl, ppo)),
            (strings{"policy", "critic", "reference", "reward", "rollout"}));
  // GRPO has no critic; no KL, no reference.
  auto grpo = job_of({"rl.algorithm=grpo", "rl.samples_per_prompt=4"});
  EXPECT_EQ(names(stage_cast(stage_id::rl, grpo)),
            (strings{"policy", "reference", "reward", "rollout"}));
  auto no_kl = job_of({"rl.kl.coef=0"});
  EXPECT_EQ(names(stage_cast(stage_id::rl, no_kl)),
            (strings{"policy", "critic", "reward", "rollout"}));
  EXPECT_TRUE(in_cast(stage_id::rl, role_id::critic, ppo));
  EXPECT_FALSE(in_cast(stage_id::rl, role_id::critic, grpo));
  EXPECT_FALSE(in_cast(stage_id::sft, role_id::reward, ppo));
}

TEST(StageTable, RowsSayWhatDpRanksSplitAndHowModelsStart) {
  auto c = job_of({"sft.batch_size=24", "rm.batch_size=12", "rl.prompts_per_iteration=16",
                   "rl.samples_per_prompt=2", "rl.minibatches=4"});
  EXPECT_EQ(traits_of(stage_id::sft).dp_rows(c),
            (std::pair<std::string, int64_t>{"sft.batch_size", 24}));
  EXPECT_EQ(traits_of(stage_id::rm).dp_rows(c).second, 12);
  EXPECT_EQ(traits_of(stage_id::dpo).dp_rows(job_of({"dpo.batch_size=10"})).second, 10);
  // Pairs are two sequences (the planner's memory and traffic count both).
  EXPECT_EQ(traits_of(stage_id::rm).sequences_per_row, 2);
  EXPECT_EQ(traits_of(stage_id::dpo).sequences_per_row, 2);
  EXPECT_EQ(traits_of(stage_id::sft).sequences_per_row, 1);
  EXPECT_EQ(traits_of(stage_id::rl).dp_rows(c).second, 8);
  // Every role of the rl stage starts from a seed of its own; sft's roles share one.
  std::set<uint64_t> seeds;
  for (const auto& r : all_roles())
    seeds.insert(traits_of(stage_id::rl).seed(c, r));
  EXPECT_EQ(seeds.size(), all_roles().size());
  EXPECT_EQ(traits_of(stage_id::sft).seed(c, traits_of(role_id::policy)),
            traits_of(stage_id::sft).seed(c, traits_of(role_id::rollout)));
  EXPECT_EQ(traits_of(stage_id::rl).optim(job_of({"rl.critic.optim.lr=0.5"}), role_id::critic).lr,
            0.5);
}

TEST(RoleTraits, TheTableSaysWhatWasComputedByHand) {
  for (size_t i = 0; i < all_roles().size(); ++i)
    EXPECT_EQ(static_cast<size_t>(all_roles()[i].id), i);
  const auto& policy = traits_of(role_id::policy);
  EXPECT_TRUE(policy.trains_in(stage_id::sft) && policy.trains_in(stage_id::rl));
  EXPECT_FALSE(traits_of(role_id::reference).trains());
  EXPECT_FALSE(traits_of(role_id::rollout).trains());
  // The reward scores in rl and trains in rm.
  const auto& reward = traits_of(role_id::reward);
  EXPECT_EQ(reward.actor_in(stage_id::rl), role_actor::judge);
  EXPECT_EQ(reward.actor_in(stage_id::rm), role_actor::trainer);
  EXPECT_TRUE(reward.fresh_head_in(stage_id::rm));
  EXPECT_FALSE(reward.fresh_head_in(stage_id::rl));
  EXPECT_TRUE(traits_of(role_id::critic).fresh_head_in(stage_id::rl));
  EXPECT_FALSE(policy.fresh_head_in(stage_id::rl));
  EXPECT_EQ(role_of_phase("update_critic")->id, role_id::critic);
  EXPECT_EQ(role_of_phase("adv"), nullptr);
  // Each role is idle after one of its own phases.
  for (const auto& r : all_roles())
    EXPECT_NE(std::find(r.rl_phases.begin(), r.rl_phases.end(), r.rl_idle_after), r.rl_phases.end())
        << r.name;
}

TEST(Cast, SpawnsInOrderWithRoleEventsAndRefusesASecondSpawn) {
  fixture f;
  auto c = f.make(stage_id::rl);
  for (auto role : stage_cast(stage_id::rl, job_of()))
    ASSERT_TRUE(c.spawn(role, role == role_id::reward ? "" : "model"));
  strings order;
  for (const auto& s : f.host.specs) {
    order.push_back(s.role);
    EXPECT_EQ(s.stage, "rl");
    EXPECT_EQ(s.job_yaml, "run: {}\n");
  }
  EXPECT_EQ(order, (strings{"policy", "critic", "reference", "reward", "rollout"}));
  strings visited;
  c.for_each([&](const rld::cast_member& m) {
    visited.emplace_back(m.traits->name);
    EXPECT_EQ(m.handle, m.ranks.front());
    EXPECT_EQ(m.generation, 0u);
  });
  EXPECT_EQ(visited, order);
  ASSERT_EQ(f.events.size(), 10u); // started + ready per role
  auto* first = std::get_if<job_events::role_changed>(&f.events[0]);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->role, "policy");
  EXPECT_EQ(first->status, "started");
  EXPECT_EQ(std::get<job_events::role_changed>(f.events[1]).status, "ready");
  auto again = c.spawn(role_id::policy, "model");
  ASSERT_FALSE(again);
  EXPECT_NE(describe(again.error()).find("policy is already in the cast"), std::string::npos);

  // A role the host cannot build fails naming it, with a failed event.
  fixture g;
  g.host.fail_role = "critic";
  auto d = g.make(stage_id::rl);
  ASSERT_TRUE(d.spawn(role_id::policy, "m"));
  auto bad = d.spawn(role_id::critic, "m");
  ASSERT_FALSE(bad);
  EXPECT_EQ(code_of(bad.error()), errc::unavailable);
  EXPECT_NE(describe(bad.error()).find("rl: spawning critic: no worker for critic"),
            std::string::npos);
  EXPECT_EQ(std::get<job_events::role_changed>(g.events.back()).status, "failed");
  EXPECT_FALSE(d.has(role_id::critic));
}

TEST(Cast, ReleasesEachRoleAfterItsLastPhase) {
  fixture f;
  auto c = f.make(stage_id::rl);
  for (auto role : stage_cast(stage_id::rl, job_of()))
    ASSERT_TRUE(c.spawn(role, "model")); // a reward model: it has something to free
  double busy = 0;
  auto release = [&](std::string_view phase, std::function<bool(role_id)> keep = {}) {
    auto r = c.release_after(phase, keep, busy);
    EXPECT_TRUE(r) << describe(r.error());
    return r ? *r : std::optional<int64_t>{};
  };
  EXPECT_EQ(release("gen"), 100);
  EXPECT_EQ(f.log->take(), (strings{"rollout: release"}));
  EXPECT_EQ(release("ref"), 1000);
  EXPECT_EQ(f.log->take(), (strings{"reference: release offload"}));
  EXPECT_EQ(release("reward"), 1000);
  EXPECT_EQ(release("update_critic"), 1000);
  EXPECT_EQ(release("weight_sync"), 1000);
  EXPECT_EQ(f.log->take(), (strings{"reward: release offload", "critic: release offload",
                                    "policy: release offload"}));
  EXPECT_EQ(busy, 2.0); // four answers of 0.5 s (the rollout's carries none)
  // Phases after which nobody idles ask nobody.
  for (auto phase : {"old_log_prob", "values", "adv", "update_actor", "evaluate"})
    EXPECT_EQ(release(phase), std::nullopt) << phase;
  EXPECT_TRUE(f.log->take().empty());
  // A kept role is not asked (the rollout generating ahead).
  EXPECT_EQ(release("gen", [](role_id r) { return r == role_id::rollout; }), std::nullopt);
  EXPECT_TRUE(f.log->take().empty());

  // A rule-only reward holds nothing to free.
  fixture g;
  auto d = g.make(stage_id::rl);
  ASSERT_TRUE(d.spawn(role_id::reward, ""));
  auto r = d.release_after("reward", {}, busy);
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, std::nullopt);
  EXPECT_TRUE(g.log->take().empty());
}

TEST(Cast, InjectsFaultsIntoInjectableRolesOnly) {
  fixture f;
  auto c = f.make(stage_id::rl);
  ASSERT_TRUE(c.spawn(role_id::policy, "m"));
  ASSERT_TRUE(c.spawn(role_id::rollout, "m"));
  EXPECT_TRUE(c.inject(role_id::policy));
  EXPECT_FALSE(c.inject(role_id::rollout)) << "the rollout is not injectable";
  EXPECT_FALSE(c.inject(role_id::critic)) << "not in the cast";
  // The stub logs the injection; a release after it shows the order held.
  double busy = 0;
  ASSERT_TRUE(c.release_after("weight_sync", {}, busy));
  EXPECT_EQ(f.log->take(), (strings{"policy: inject", "policy: release offload"}));
}

TEST(Cast, ReplacesARankAndBumpsItsGeneration) {
  fixture f;
  auto c = f.make(stage_id::rl, [](role_id r) { return r == role_id::critic ? 2 : 1; });
  ASSERT_TRUE(c.spawn(role_id::policy, "m"));
  ASSERT_TRUE(c.spawn(role_id::critic, "m"));
  auto old = c.handle(role_id::policy);
  auto fresh = f.sys->spawn(stub, std::string{"policy-2"}, f.log);
  ASSERT_TRUE(c.replace(role_id::policy, 0, fresh));
  EXPECT_EQ(c.handle(role_id::policy), fresh);
  EXPECT_EQ(c.member(role_id::policy)->ranks.front(), fresh);
  EXPECT_EQ(c.generation(role_id::policy), 1u);
  EXPECT_EQ(c.generation(role_id::critic), 0u);
  // The new rank is the one asked.
  double busy = 0;
  ASSERT_TRUE(c.release_after("weight_sync", {}, busy));
  EXPECT_EQ(f.log->take(), (strings{"policy-2: release offload"}));
  caf::anon_send_exit(old, caf::exit_reason::user_shutdown);

  EXPECT_EQ(code_of(c.replace(role_id::reward, 0, fresh).error()), errc::not_found);
  EXPECT_EQ(code_of(c.replace(role_id::policy, 1, fresh).error()), errc::out_of_range);
  EXPECT_EQ(code_of(c.replace(role_id::policy, 0, caf::actor{}).error()), errc::invalid_argument);
  // A DP group: two ranks behind one group handle.
  const auto* critic = c.member(role_id::critic);
  ASSERT_EQ(critic->ranks.size(), 2u);
  EXPECT_NE(critic->handle, critic->ranks[0]);
  EXPECT_EQ(code_of(c.replace(role_id::critic, 1, fresh).error()), errc::unsupported);
}

// NOTE [supervision]: a lost role is built again in place, every rank of
// it, its processes revived first and its groups under the next
// generation's prefix; the old instance is ended.
TEST(Cast, RespawnsALostRoleUnderItsNextGeneration) {
  fixture f;
  auto c = f.make(stage_id::rl, [](role_id r) { return r == role_id::rollout ? 2 : 1; });
  ASSERT_TRUE(c.spawn(role_id::reference, "ref-model"));
  ASSERT_TRUE(c.spawn(role_id::rollout, "m"));
  auto old = c.handle(role_id::reference);
  ASSERT_TRUE(c.respawn(role_id::reference));
  EXPECT_TRUE(f.ended(old)) << "the lost instance is ended";
  EXPECT_NE(c.handle(role_id::reference), old);
  EXPECT_EQ(c.generation(role_id::reference), 1u);
  EXPECT_EQ(c.generation(role_id::rollout), 0u);
  ASSERT_TRUE(c.respawn(role_id::rollout));
  ASSERT_TRUE(c.respawn(role_id::rollout));
  EXPECT_EQ(c.generation(role_id::rollout), 2u);
  EXPECT_EQ(c.member(role_id::rollout)->ranks.size(), 2u);
  EXPECT_EQ(f.host.revived, (strings{"reference rl/reference/g1", "rollout rl/rollout/g1",
                                     "rollout rl/rollout/g2"}));
  // Built from the same model, as the first instance was.
  EXPECT_EQ(f.host.specs.back().model_dir, "m");
  EXPECT_EQ(f.host.specs.at(2).model_dir, "ref-model");
  EXPECT_EQ(f.host.specs.at(2).group_name, "rl/reference/g1");
  // The new one answers.
  double busy = 0;
  ASSERT_TRUE(c.release_after("ref", {}, busy));
  EXPECT_EQ(f.log->take(), (strings{"reference: release offload"}));
  EXPECT_EQ(code_of(c.respawn(role_id::critic).error()), errc::not_found);
  f.host.fail_role = "reference";
  auto failed = c.respawn(role_id::reference);
  ASSERT_FALSE(failed);
  EXPECT_NE(describe(failed.error()).find("rl: restarting reference"), std::string::npos)
      << describe(failed.error());
}

TEST(Cast, StopEndsEveryMemberAndTheirRanks) {
  fixture f;
  std::vector<caf::actor> spawned;
  {
    auto c = f.make(stage_id::rl, [](role_id r) { return r == role_id::policy ? 2 : 1; });
    ASSERT_TRUE(c.spawn(role_id::policy, "m"));
    ASSERT_TRUE(c.spawn(role_id::rollout, "m"));
    c.for_each([&](const rld::cast_member& m) {
      spawned.push_back(m.handle);
      spawned.insert(spawned.end(), m.ranks.begin(), m.ranks.end());
    });
    c.stop();
    EXPECT_FALSE(c.has(role_id::policy));
  }
  ASSERT_EQ(spawned.size(), 5u); // the group, its 2 ranks; the rollout twice
  for (const auto& a : spawned)
    EXPECT_TRUE(f.ended(a));
  // A cast going out of scope stops what it holds.
  caf::actor left;
  {
    auto c = f.make(stage_id::sft);
    ASSERT_TRUE(c.spawn(role_id::rollout, "m"));
    left = c.handle(role_id::rollout);
  }
  EXPECT_TRUE(f.ended(left));
}
