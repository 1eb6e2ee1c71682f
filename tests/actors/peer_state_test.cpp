// NOTE [peer state] and NOTE [kill inside a collective] at the engine: two
// DP ranks under ddp (gloo, in this process, a thread each). A rank that
// keeps its state before updates hands back the state its last update
// began from; when its peer dies inside a collective of an update, the
// survivor fails with errc::unavailable (a consequence, not the cause) and
// still holds the state the interrupted update began from.
#include "actors/train/train_engine.hpp"
#include "tests/actors/tiny_engine.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <future>
#include <stdexcept>

using namespace troupe;
using troupe::actors::inference::testing::copy_of;
using troupe::actors::inference::testing::rl_batch;
using troupe::actors::inference::testing::state_tensors;
using troupe::actors::inference::testing::tiny_model;

namespace {

std::unique_ptr<actors::train::train_engine> trainable(models::llama_model m) {
  actors::train::optimizer_options o;
  o.lr = 1e-3;
  auto e = actors::train::train_engine::make(std::move(m), o);
  EXPECT_TRUE(e) << describe(e.error());
  return std::move(*e);
}

bool same_state(const std::string& a, const std::string& b) {
  auto x = state_tensors(a), y = state_tensors(b);
  if (x.size() != y.size())
    return false;
  for (const auto& [k, t] : x)
    if (!y.count(k) || !torch::equal(t, y.at(k)))
      return false;
  return true;
}

// Two ddp ranks from the same weights, joined, keeping their state before
// updates; each rank's share of an RL batch.
struct two_ranks {
  std::vector<std::unique_ptr<actors::train::train_engine>> engines;
  std::vector<runtime::tensor_batch> shares;
  actors::train::policy_update_options opts;

  explicit two_ranks(const std::string& name) {
    runtime::group_options go;
    go.name = name;
    go.timeout_ms = 60000; // far above what a dead peer may take to be seen
    auto groups = runtime::make_local_groups(2, go);
    EXPECT_TRUE(groups) << describe(groups.error());
    auto base = tiny_model(5);
    for (int r = 0; r < 2; ++r) {
      engines.push_back(trainable(copy_of(base, models::head_kind::lm)));
      shares.push_back(rl_batch(4, 30 + static_cast<uint64_t>(r)));
    }
    opts.minibatches = 2;
    opts.shuffle = false;
    both([&](int r) -> expected<void> {
      auto g = std::make_shared<actors::train::data_parallel_group>();
      g->store = std::move(groups->stores[static_cast<size_t>(r)]);
      g->group = std::move(groups->groups[static_cast<size_t>(r)]);
      auto& e = *engines[static_cast<size_t>(r)];
      if (auto ok = e.join_data_parallel(std::move(g)); !ok)
        return ok.error();
      return e.keep_state_before_updates(true);
    });
  }

  // Runs f(rank) on both ranks at once; their results.
  std::vector<expected<void>> both(const std::function<expected<void>(int)>& f) {
    auto other = std::async(std::launch::async, f, 1);
    std::vector<expected<void>> out;
    out.push_back(f(0));
    out.push_back(other.get());
    for (const auto& r : out)
      EXPECT_TRUE(r) << describe(r.error());
    return out;
  }

  expected<void> update(int r) {
    auto m = engines[static_cast<size_t>(r)]->update_policy(shares[static_cast<size_t>(r)], opts);
    if (!m)
      return m.error();
    return {};
  }
};

} // namespace

TEST(PeerState, ARankHandsBackTheStateItsLastUpdateBeganFrom) {
  two_ranks t("peer-state");
  t.both([&](int r) { return t.update(r); }); // the optimizer has moments now
  auto before = t.engines[0]->save_state();
  ASSERT_TRUE(before) << describe(before.error());
  t.both([&](int r) { return t.update(r); });
  auto kept = t.engines[0]->state_before_update();
  auto now = t.engines[0]->save_state();
  ASSERT_TRUE(kept && now);
  EXPECT_TRUE(same_state(*kept, *before));
  EXPECT_FALSE(same_state(*now, *before)); // the update stepped
  // Every rank holds the same whole state under ddp.
  auto other = t.engines[1]->state_before_update();
  ASSERT_TRUE(other);
  EXPECT_TRUE(same_state(*other, *before));
  // Off: the state now.
  ASSERT_TRUE(t.engines[0]->keep_state_before_updates(false));
  auto plain = t.engines[0]->state_before_update();
  ASSERT_TRUE(plain);
  EXPECT_TRUE(same_state(*plain, *now));
}

TEST(PeerState, AFrozenEngineHasNoStateToKeep) {
  auto e = actors::train::train_engine::make(tiny_model(5), std::nullopt);
  ASSERT_TRUE(e);
  auto ok = (*e)->keep_state_before_updates(true);
  ASSERT_FALSE(ok);
  EXPECT_EQ(code_of(ok.error()), errc::invalid_argument);
  auto none = (*e)->die_in_collective(1, [] {});
  ASSERT_FALSE(none); // in no DP group
  EXPECT_NE(describe(none.error()).find("no DP group"), std::string::npos);
}

// Rank 1 dies as its update's 3rd group operation begins (the hook throws,
// then its engine is destroyed, as its process would end): rank 0, inside
// that collective, fails with unavailable at once rather than at the
// group's timeout, and keeps the state from before the update, whatever
// steps it took in it.
TEST(PeerState, APeerDyingInsideACollectiveLeavesTheSurvivorTheStateBeforeTheUpdate) {
  two_ranks t("peer-dies");
  t.both([&](int r) { return t.update(r); });
  auto before = t.engines[0]->save_state();
  ASSERT_TRUE(before);
  ASSERT_TRUE(t.engines[1]->die_in_collective(
      3, [] { throw std::runtime_error("killed inside a collective (test)"); }));
  const auto t0 = std::chrono::steady_clock::now();
  auto dying = std::async(std::launch::async, [&]() -> expected<void> {
    auto r = t.update(1);
    t.engines[1].reset(); // its connections close
    return r;
  });
  auto survivor = t.update(0);
  auto died = dying.get();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(died);
  EXPECT_NE(describe(died.error()).find("killed inside a collective"), std::string::npos)
      << describe(died.error());
  ASSERT_FALSE(survivor);
  EXPECT_EQ(code_of(survivor.error()), errc::unavailable) << describe(survivor.error());
  EXPECT_LT(took, 20.0) << "the survivor waited for the group's timeout";
  auto kept = t.engines[0]->state_before_update();
  ASSERT_TRUE(kept) << describe(kept.error());
  EXPECT_TRUE(same_state(*kept, *before));
}
