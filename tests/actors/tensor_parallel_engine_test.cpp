// Training under tensor parallelism (NOTE [tensor parallelism]): TP 2, and
// DP 2 × TP 2 under ddp, zero1 and zero2 over the DP dimension, train the same
// model on the same global batches to within 1e-5 of one engine after 5
// Adam steps (gloo ranks in this process, one thread a rank), with the
// gradient clip active (NOTE [tensor-parallel norm]), for SFT, PPO updates
// and a critic; the export gathers the whole weights; the engine group
// gives each replica's rows to its TP ranks (NOTE [tensor-parallel
// dispatch]).
#include "actors/actor_system.hpp"
#include "actors/train/engine_group.hpp"
#include "actors/train/train_engine.hpp"
#include "models/tensor_parallel.hpp"
#include "tests/actors/mesh_training.hpp"
#include "tests/actors/tiny_engine.hpp"
#include "tests/support/ranks.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace troupe;
using namespace troupe::actors;
using troupe::actors::inference::testing::copy_of;
using troupe::actors::inference::testing::rl_batch;
using troupe::actors::inference::testing::tiny_model;
using troupe::testing::on_every_rank;

using namespace troupe::testing::mesh;

namespace {

void expect_like_one(uint64_t seed, models::head_kind head, const step_fn& step, int dp, int tp,
                     train::dp_strategy strategy = train::dp_strategy::ddp) {
  expect_like_one(tiny_model(seed), head, step, layout{dp, tp}, strategy);
}

TEST(TensorParallelEngine, TwoRanksTrainSftLikeOneEngine) {
  expect_like_one(11, models::head_kind::lm, sft(), 1, 2);
}

TEST(TensorParallelEngine, TwoRanksRunPpoUpdatesLikeOneEngine) {
  expect_like_one(12, models::head_kind::lm, ppo(), 1, 2);
}

TEST(TensorParallelEngine, TwoRanksTrainACriticLikeOneEngine) {
  expect_like_one(13, models::head_kind::value, critic(), 1, 2);
}

TEST(TensorParallelEngine, DpTwoByTpTwoTrainsLikeOneEngine) {
  expect_like_one(14, models::head_kind::lm, ppo(), 2, 2);
}

TEST(TensorParallelEngine, Zero1OverDpWithTpTwoTrainsLikeOneEngine) {
  expect_like_one(15, models::head_kind::lm, sft(), 2, 2, train::dp_strategy::zero1);
}

// zero2 reduce-scatters over the DP group during backward, while the TP
// layers all-reduce over the TP group in the same backward.
TEST(TensorParallelEngine, Zero2OverDpWithTpTwoRunsPpoLikeOneEngine) {
  expect_like_one(19, models::head_kind::lm, ppo(), 2, 2, train::dp_strategy::zero2);
}

template <class R, class... Ts>
expected<R> ask(caf::actor_system& sys, const train::engine_actor& a, Ts&&... xs) {
  expected<R> out = make_error(errc::internal, "no reply");
  caf::scoped_actor self{sys};
  self->request(a, std::chrono::seconds(60), std::forward<Ts>(xs)...)
      .receive([&](R& r) { out = std::move(r); }, [&](caf::error& e) { out = e; });
  return out;
}

void check_group(caf::actor_system& sys, const models::llama_model& base,
                 std::vector<mesh_rank>& ranks, std::vector<mesh_rank>& fresh);

TEST(TensorParallelEngine, TheGroupGivesEachReplicasRowsToItsTpRanks) {
  caf::actor_system_config cfg;
  actors::configure(cfg);
  auto system = std::make_unique<caf::actor_system>(cfg);
  auto& sys = *system;
  auto base = tiny_model(17);
  runtime::group_options go;
  go.name = "tp-group";
  auto world = runtime::make_local_groups(4, go);
  ASSERT_TRUE(world);
  auto ranks = mesh_engines(*world, base, layout{2, 2});
  // Another model at dp 1 × tp 2, for the checkpoint to land in.
  go.name = "tp-restored";
  auto world2 = runtime::make_local_groups(2, go);
  ASSERT_TRUE(world2);
  auto fresh = mesh_engines(*world2, tiny_model(18), layout{1, 2});
  check_group(sys, base, ranks, fresh); // the actors' handles end with it
  system.reset();                       // the ranks end before their groups do
}

std::vector<train::engine_actor> spawn_ranks(caf::actor_system& sys, const std::string& role,
                                             std::vector<mesh_rank>& ranks) {
  std::vector<train::engine_actor> out;
  for (size_t r = 0; r < ranks.size(); ++r)
    out.push_back(train::spawn_engine_actor(sys, role + "[" + std::to_string(r) + "]",
                                            std::move(ranks[r].engine)));
  return out;
}

void check_group(caf::actor_system& sys, const models::llama_model& base,
                 std::vector<mesh_rank>& ranks, std::vector<mesh_rank>& fresh) {
  auto single = train::spawn_engine_actor(
      sys, "single",
      std::move(*train::train_engine::make(copy_of(base, models::head_kind::lm), optim())));
  auto group = train::spawn_engine_group(sys, "policy", spawn_ranks(sys, "policy", ranks),
                                         train::dp_strategy::ddp, 2);
  auto restored = train::spawn_engine_group(sys, "restored", spawn_ranks(sys, "restored", fresh),
                                            train::dp_strategy::ddp, 2);

  auto batch = rl_batch(6, 300); // 3 rows a replica
  auto lp_one =
      ask<train::served_batch>(sys, single, train::log_probs_atom::value, batch, 1.0, true);
  auto lp_tp = ask<train::served_batch>(sys, group, train::log_probs_atom::value, batch, 1.0, true);
  ASSERT_TRUE(lp_one && lp_tp) << describe(lp_tp ? lp_one.error() : lp_tp.error());
  for (const char* key : {"log_probs", "entropy"}) {
    auto a = *lp_one->value.get(key), b = *lp_tp->value.get(key);
    ASSERT_EQ(a.sizes(), b.sizes()) << key;
    EXPECT_LT((a - b).abs().max().item<double>(), tolerance) << key;
  }
  train::policy_update_options o;
  o.minibatches = 2;
  o.epochs = 2;
  o.entropy_coef = 0.01;
  auto big = rl_batch(8, 301);
  auto m_one = ask<train::served_metrics>(sys, single, train::update_policy_atom::value, big, o);
  auto m_tp = ask<train::served_metrics>(sys, group, train::update_policy_atom::value, big, o);
  ASSERT_TRUE(m_one && m_tp) << describe(m_tp ? m_one.error() : m_tp.error());
  for (const auto& [k, v] : m_one->value)
    EXPECT_NEAR(m_tp->value.at(k), v, tolerance * std::max(1.0, std::abs(v))) << k;
  auto w_one = ask<actors::shared_weights>(sys, single, train::export_atom::value);
  auto w_tp = ask<actors::shared_weights>(sys, group, train::export_atom::value);
  ASSERT_TRUE(w_one && w_tp) << describe(w_tp ? w_one.error() : w_tp.error());
  for (const auto& [name, t] : **w_one)
    EXPECT_LT(((*w_tp)->at(name) - t).abs().max().item<double>(), tolerance) << name;
  auto state = ask<std::string>(sys, group, train::save_state_atom::value);
  ASSERT_FALSE(state);
  EXPECT_NE(describe(state.error()).find("model-parallel ranks (tp 2, pp 1) are not supported yet"),
            std::string::npos);
  // The checkpoint: every rank's shard, loaded under another dp with the
  // same tp, gives the same weights bit for bit; another tp is refused.
  auto shards = ask<train::state_shards>(sys, group, train::save_shards_atom::value);
  ASSERT_TRUE(shards) << describe(shards.error());
  EXPECT_EQ(shards->tp, 2);
  EXPECT_EQ(shards->shards.size(), 4u);
  auto wrong = *shards;
  wrong.tp = 1;
  auto refused = ask<int64_t>(sys, restored, train::load_shards_atom::value, wrong);
  ASSERT_FALSE(refused);
  EXPECT_NE(describe(refused.error()).find("saved by tp 1, pp 1 ranks, this role has tp 2, pp 1"),
            std::string::npos)
      << describe(refused.error());
  auto loaded = ask<int64_t>(sys, restored, train::load_shards_atom::value, *shards);
  ASSERT_TRUE(loaded) << describe(loaded.error());
  auto w_back = ask<actors::shared_weights>(sys, restored, train::export_atom::value);
  ASSERT_TRUE(w_back) << describe(w_back.error());
  for (const auto& [name, t] : **w_tp)
    EXPECT_TRUE(torch::equal((*w_back)->at(name), t)) << name;
  caf::anon_send_exit(restored, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(group, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(single, caf::exit_reason::user_shutdown);
}

TEST(TensorParallelEngine, Zero3UnderTpIsRefusedWithAReason) {
  auto base = tiny_model(16);
  runtime::group_options go;
  go.name = "tp-zero3";
  auto world = runtime::make_local_groups(4, go);
  ASSERT_TRUE(world);
  auto errors = on_every_rank<std::string>(world->groups, [&](runtime::process_group& g) {
    auto lines = runtime::make_mesh_groups(g, runtime::rank_mesh{{2, 2}}, {"dp", "tp"});
    auto part = models::partition_llama(base->config(), (*lines)[1]);
    auto model = models::make_llama(base->config(), models::head_kind::lm, *part);
    auto e = train::train_engine::make(*model, optim());
    auto d = std::make_shared<train::data_parallel_group>();
    d->group = std::move((*lines)[0]);
    auto ok = (*e)->join_data_parallel(d, {train::dp_strategy::zero3, 25});
    return ok ? std::string{} : describe(ok.error());
  });
  for (const auto& e : errors)
    EXPECT_NE(e.find("zero3 under tensor parallelism"), std::string::npos) << e;
}

} // namespace
