#pragma once
// The engine group of a DP × PP × TP mesh against one engine (NOTE
// [tensor-parallel dispatch] in actors/train/engine_group.hpp): log-probs,
// PPO updates and the export answer as one engine's; a whole state is
// refused; the checkpoint (every rank's shard) loads bit for bit into a
// mesh of another dp and the same tp and pp, and is refused by another
// tp or pp with both layouts named.
#include "actors/actor_system.hpp"
#include "actors/train/engine_group.hpp"
#include "tests/actors/mesh_training.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace troupe::testing::mesh {

template <class R, class... Ts>
expected<R> ask(caf::actor_system& sys, const train::engine_actor& a, Ts&&... xs) {
  expected<R> out = make_error(errc::internal, "no reply");
  caf::scoped_actor self{sys};
  self->request(a, std::chrono::seconds(60), std::forward<Ts>(xs)...)
      .receive([&](R& r) { out = std::move(r); }, [&](caf::error& e) { out = e; });
  return out;
}

inline std::vector<train::engine_actor> spawn_ranks(caf::actor_system& sys, const std::string& role,
                                                    std::vector<mesh_rank>& ranks) {
  std::vector<train::engine_actor> out;
  for (size_t r = 0; r < ranks.size(); ++r)
    out.push_back(train::spawn_engine_actor(sys, role + "[" + std::to_string(r) + "]",
                                            std::move(ranks[r].engine)));
  return out;
}

inline std::string sizes(const layout& l) {
  return "tp " + std::to_string(l.tp) + ", pp " + std::to_string(l.pp);
}

// The checks on a running group of `l` and one of `restored` (same tp and
// pp, another dp), each over its own ranks.
inline void check_group(caf::actor_system& sys, const models::llama_model& base, const layout& l,
                        std::vector<mesh_rank>& ranks, const layout& restored,
                        std::vector<mesh_rank>& fresh) {
  using actors::inference::testing::copy_of;
  auto single = train::spawn_engine_actor(
      sys, "single",
      std::move(*train::train_engine::make(copy_of(base, models::head_kind::lm), optim())));
  auto group = train::spawn_engine_group(sys, "policy", spawn_ranks(sys, "policy", ranks),
                                         train::dp_strategy::ddp, l.tp, l.pp);
  auto back = train::spawn_engine_group(sys, "restored", spawn_ranks(sys, "restored", fresh),
                                        train::dp_strategy::ddp, restored.tp, restored.pp);
  auto batch = rl_batch(6, 300); // 3 rows a replica
  auto lp_one =
      ask<train::served_batch>(sys, single, train::log_probs_atom::value, batch, 1.0, true);
  auto lp = ask<train::served_batch>(sys, group, train::log_probs_atom::value, batch, 1.0, true);
  ASSERT_TRUE(lp_one && lp) << describe(lp ? lp_one.error() : lp.error());
  for (const char* key : {"log_probs", "entropy"}) {
    auto a = *lp_one->value.get(key), b = *lp->value.get(key);
    ASSERT_EQ(a.sizes(), b.sizes()) << key;
    EXPECT_LT((a - b).abs().max().item<double>(), tolerance) << key;
  }
  train::policy_update_options o;
  o.minibatches = 2;
  o.epochs = 2;
  o.loss.entropy_coef = 0.01;
  auto big = rl_batch(8, 301);
  auto m_one = ask<train::served_metrics>(sys, single, train::update_policy_atom::value, big, o);
  auto m = ask<train::served_metrics>(sys, group, train::update_policy_atom::value, big, o);
  ASSERT_TRUE(m_one && m) << describe(m ? m_one.error() : m.error());
  for (const auto& [k, v] : m_one->value)
    EXPECT_NEAR(m->value.at(k), v, tolerance * std::max(1.0, std::abs(v))) << k;
  auto w_one = ask<actors::shared_weights>(sys, single, train::export_atom::value);
  auto w = ask<actors::shared_weights>(sys, group, train::export_atom::value);
  ASSERT_TRUE(w_one && w) << describe(w ? w_one.error() : w.error());
  ASSERT_EQ((*w)->size(), (*w_one)->size());
  for (const auto& [name, t] : **w_one)
    EXPECT_LT(((*w)->at(name) - t).abs().max().item<double>(), tolerance) << name;
  auto state = ask<std::string>(sys, group, train::save_state_atom::value);
  ASSERT_FALSE(state);
  EXPECT_NE(describe(state.error()).find("model-parallel ranks (" + sizes(l) + ") are not supported yet"),
            std::string::npos)
      << describe(state.error());
  auto shards = ask<train::state_shards>(sys, group, train::save_shards_atom::value);
  ASSERT_TRUE(shards) << describe(shards.error());
  EXPECT_EQ(shards->tp, l.tp);
  EXPECT_EQ(shards->pp, l.pp);
  EXPECT_EQ(shards->shards.size(), static_cast<size_t>(l.size()));
  auto wrong = *shards;
  (l.pp > 1 ? wrong.pp : wrong.tp) = 1;
  auto refused = ask<int64_t>(sys, back, train::load_shards_atom::value, wrong);
  ASSERT_FALSE(refused);
  const layout saved{1, wrong.tp, wrong.pp};
  EXPECT_NE(describe(refused.error())
                .find("saved by " + sizes(saved) + " ranks, this role has " + sizes(restored)),
            std::string::npos)
      << describe(refused.error());
  auto loaded = ask<int64_t>(sys, back, train::load_shards_atom::value, *shards);
  ASSERT_TRUE(loaded) << describe(loaded.error());
  auto w_back = ask<actors::shared_weights>(sys, back, train::export_atom::value);
  ASSERT_TRUE(w_back) << describe(w_back.error());
  for (const auto& [name, t] : **w)
    EXPECT_TRUE(torch::equal((*w_back)->at(name), t)) << name;
  caf::anon_send_exit(back, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(group, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(single, caf::exit_reason::user_shutdown);
}

/// A group of `l` over `base` passes check_group, its checkpoint landing in
/// a fresh model (seeded `fresh_seed`) at `restored`.
inline void expect_group_like_one_engine(const models::llama_model& base, const layout& l,
                                         const layout& restored, uint64_t fresh_seed) {
  caf::actor_system_config cfg;
  actors::configure(cfg);
  auto system = std::make_unique<caf::actor_system>(cfg);
  runtime::group_options go;
  go.name = "mesh-group";
  auto world = runtime::make_local_groups(l.size(), go);
  ASSERT_TRUE(world);
  auto ranks = mesh_engines(*world, base, l);
  go.name = "mesh-restored";
  auto world2 = runtime::make_local_groups(restored.size(), go);
  ASSERT_TRUE(world2);
  auto fresh = mesh_engines(*world2, actors::inference::testing::tiny_model(fresh_seed), restored);
  check_group(*system, base, l, ranks, restored, fresh); // the actors' handles end with it
  system.reset();                                          // the ranks end before their groups do
}

} // namespace troupe::testing::mesh
