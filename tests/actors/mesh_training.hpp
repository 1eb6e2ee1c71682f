#pragma once
// Training on a DP × PP × TP mesh of in-process ranks (one thread a rank,
// gloo groups), for the model-parallel engine tests: each rank builds its
// part of a dense model, joins its lines and trains on the same global
// batches as one engine does.
#include "actors/rl/roles.hpp"
#include "actors/train/train_engine.hpp"
#include "models/llama.hpp"
#include "runtime/shm_collectives.hpp"
#include "tests/actors/tiny_engine.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <vector>

namespace troupe::testing::mesh {

using actors::inference::testing::copy_of;
using actors::inference::testing::rl_batch;
namespace train = actors::train;

constexpr double tolerance = 1e-5;

inline train::optimizer_options optim() {
  train::optimizer_options o;
  o.lr = 1e-3;       // as the DP tests: Adam moves each weight ~lr a step, whatever the gradient
  o.grad_clip = 0.5; // the clip sees the whole gradient's norm
  return o;
}

// One optimizer step of `kind` on `batch`; its metrics.
using step_fn =
    std::function<expected<train::metric_map>(train::train_engine&, const runtime::tensor_batch&)>;

inline step_fn sft() {
  return [](train::train_engine& e, const runtime::tensor_batch& b) { return e.sft_step(b); };
}
inline step_fn ppo() {
  return [](train::train_engine& e, const runtime::tensor_batch& b) {
    train::policy_update_options o;
    o.loss.entropy_coef = 0.01;
    o.loss.kl_coef = 0.1;
    o.shuffle = false;
    return e.update_policy(b, o);
  };
}
inline step_fn critic() {
  return [](train::train_engine& e, const runtime::tensor_batch& b) {
    train::critic_update_options o;
    o.shuffle = false;
    return e.update_critic(b, o);
  };
}

struct trained {
  std::map<std::string, at::Tensor> weights; // exported (whole) by rank 0
  std::vector<train::metric_map> metrics;    // of each step
};

// The 5 steps' batches, made before any rank starts (torch's global
// generator, which rl_batch seeds, is not per thread).
inline const std::vector<runtime::tensor_batch>& step_batches() {
  static const auto batches = [] {
    std::vector<runtime::tensor_batch> out;
    for (uint64_t s = 0; s < 5; ++s)
      out.push_back(rl_batch(8, 100 + s));
    return out;
  }();
  return batches;
}

// 5 steps of `step` on step_batches() (a DP rank takes its contiguous part).
inline trained train_steps(train::train_engine& e, const step_fn& step, int dp_rank, int dp,
                           bool exports) {
  trained out;
  for (const auto& batch : step_batches()) {
    auto mine = batch.slice(8 * dp_rank / dp, 8 * (dp_rank + 1) / dp);
    EXPECT_TRUE(mine);
    auto m = step(e, *mine);
    EXPECT_TRUE(m) << describe(m.error());
    out.metrics.push_back(m ? *m : train::metric_map{});
  }
  if (exports)
    out.weights = e.export_weights();
  else
    EXPECT_TRUE(e.gather_weights());
  return out;
}

/// The shape of a mesh: rank (d · pp + p) · tp + t (TP the fastest, as it
/// stays within a node).
struct layout {
  int dp = 1, tp = 1, pp = 1;
  /// Micro-batches a pipelined batch is cut into (0: as many as stages).
  int64_t micro_batches = 0;
  int size() const { return dp * tp * pp; }
  int dp_rank(int rank) const { return rank / (tp * pp); }
};

// A rank of the mesh and the groups its engine uses.
struct mesh_rank {
  std::shared_ptr<runtime::process_group> tp, pp; // the model's partition and stage point here
  std::unique_ptr<train::train_engine> engine;
};

// The engines of a mesh over `base` with `head`, each on its part of the
// model, DP joined under `strategy`.
inline std::vector<mesh_rank> mesh_engines(runtime::local_groups& world,
                                           const models::llama_model& base, const layout& l,
                                           models::head_kind head = models::head_kind::lm,
                                           train::dp_strategy strategy = train::dp_strategy::ddp) {
  // The dense model (a fresh head seeded as the single engine's), made
  // before the ranks start: they only read it.
  const auto dense = copy_of(base, head);
  return on_every_rank<mesh_rank>(world.groups, [&](runtime::process_group& g) {
    mesh_rank out;
    const runtime::rank_mesh mesh{{l.dp, l.pp, l.tp}};
    auto lines = runtime::make_mesh_groups(g, mesh, {"dp", "pp", "tp"});
    EXPECT_TRUE(lines) << describe(lines.error());
    auto pp = std::move((*lines)[1]);
    if (l.pp > 1) { // as a job's line on one node: hand-offs through shared memory
      const int line = mesh.line_index(g.rank(), 1);
      auto shm = runtime::with_shm_point_to_point(
          std::move(pp), world.stores[static_cast<size_t>(g.rank())],
          "mesh-pp" + std::to_string(line), actors::rl::pp_slot_bytes, actors::rl::pp_slots(l.pp));
      EXPECT_TRUE(shm) << describe(shm.error());
      pp = std::move(*shm);
    }
    out.pp = std::make_shared<runtime::process_group>(std::move(pp));
    auto tp = std::move((*lines)[2]);
    if (l.tp > 1) { // as a job's TP group: sums through shared memory (NOTE [shm all-reduce])
      auto shm = runtime::with_shm_collectives(
          std::move(tp), world.stores[static_cast<size_t>(g.rank())],
          "mesh-tp" + std::to_string(g.rank() / l.tp), int64_t{4} << 20);
      EXPECT_TRUE(shm) << describe(shm.error());
      tp = std::move(*shm);
    }
    out.tp = std::make_shared<runtime::process_group>(std::move(tp));
    auto part = models::partition_llama(base->config(), *out.tp);
    auto stage = models::stage_of(base->config(), *out.pp);
    EXPECT_TRUE(part && stage);
    auto model = models::make_model_part(dense, *part, *stage);
    EXPECT_TRUE(model) << describe(model.error());
    auto e = train::train_engine::make(*model, optim());
    EXPECT_TRUE(e);
    auto d = std::make_shared<train::data_parallel_group>();
    d->group = std::move((*lines)[0]);
    d->pp = out.pp;
    auto ok = (*e)->join_data_parallel(d, {strategy, 25});
    EXPECT_TRUE(ok) << describe(ok.error());
    EXPECT_TRUE((*e)->set_pipeline_micro_batches(l.micro_batches));
    out.engine = std::move(*e);
    return out;
  });
}

inline trained train_mesh(const models::llama_model& base, models::head_kind head,
                          const step_fn& step, const layout& l, train::dp_strategy strategy) {
  runtime::group_options go;
  go.name = "mesh-engine";
  auto world = runtime::make_local_groups(l.size(), go);
  EXPECT_TRUE(world) << describe(world.error());
  if (!world)
    return {};
  auto ranks = mesh_engines(*world, base, l, head, strategy);
  step_batches(); // before the ranks start: they only read them
  auto results = on_every_rank<trained>(world->groups, [&](runtime::process_group& g) {
    auto& e = ranks[static_cast<size_t>(g.rank())].engine;
    if (!e)
      return trained{};
    return train_steps(*e, step, l.dp_rank(g.rank()), l.dp, g.rank() == 0);
  });
  return results.front();
}

inline void expect_same(const trained& want, const trained& got) {
  ASSERT_EQ(want.metrics.size(), got.metrics.size());
  for (size_t s = 0; s < want.metrics.size(); ++s)
    for (const auto& [k, v] : want.metrics[s]) {
      ASSERT_TRUE(got.metrics[s].count(k)) << k;
      EXPECT_NEAR(got.metrics[s].at(k), v, tolerance * std::max(1.0, std::abs(v)))
          << k << " at step " << s;
    }
  ASSERT_EQ(want.weights.size(), got.weights.size());
  for (const auto& [name, t] : want.weights) {
    ASSERT_TRUE(got.weights.count(name)) << name;
    ASSERT_EQ(got.weights.at(name).sizes(), t.sizes()) << name;
    EXPECT_LT((got.weights.at(name) - t).abs().max().item<double>(), tolerance) << name;
  }
}

inline trained train_single(const models::llama_model& base, models::head_kind head,
                            const step_fn& step) {
  auto e = train::train_engine::make(copy_of(base, head), optim());
  EXPECT_TRUE(e) << describe(e.error());
  return train_steps(**e, step, 0, 1, true);
}

// The mesh trains `base` (with `head`) as one engine does.
inline void expect_like_one(const models::llama_model& base, models::head_kind head,
                            const step_fn& step, const layout& l,
                            train::dp_strategy strategy = train::dp_strategy::ddp) {
  auto want = train_single(base, head, step);
  expect_same(want, train_mesh(base, head, step, l, strategy));
}

} // namespace troupe::testing::mesh
