// NOTE [batches ahead], NOTE [paced rollout] (actors/inference/rollout.hpp):
// requests generated ahead are collected in the caller's order; a paced
// rollout takes a weight version exactly its pace of steps after the batch
// ahead, however late or early the version arrives; and the batches it
// holds, snapshotted and restored into another rollout (or fleet of as many
// replicas), finish there as they would have where they started.
#include "actors/actor_system.hpp"
#include "actors/inference/rollout_group.hpp"
#include "models/llama.hpp"
#include "tests/actors/rollout_calls.hpp"
#include "tests/actors/tiny_engine.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace troupe;
using namespace troupe::actors::inference;
using namespace troupe::actors::inference::testing;

namespace {

engine_config ahead_engine() {
  engine_config c;
  c.num_blocks = 64;
  c.block_size = 4;
  c.batch_invariant = true; // a fleet's replicas give one engine's bits
  return c;
}

std::vector<generate_request> ahead_batch(const std::string& prefix, int count, uint64_t seed) {
  std::vector<generate_request> out;
  for (int i = 0; i < count; ++i) {
    std::vector<int64_t> prompt;
    for (int t = 0; t < 3 + i % 3; ++t)
      prompt.push_back((7 * t + 3 * i + static_cast<int>(seed)) % 50);
    auto sp = random_sampling(5 + i, seed + static_cast<uint64_t>(i));
    sp.n = i % 2 == 0 ? 2 : 1;
    out.push_back({prefix + std::to_string(i), prompt, sp});
  }
  return out;
}

std::vector<std::string> ids_of(const std::vector<generate_request>& reqs) {
  std::vector<std::string> out;
  for (const auto& r : reqs)
    out.push_back(r.id);
  return out;
}

actors::shared_weights weights_of(const models::llama_model& m) {
  return std::make_shared<const std::map<std::string, at::Tensor>>(models::export_hf_weights(m));
}

void expect_same_ahead(const std::vector<request_output>& want,
                       const std::vector<request_output>& got) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t r = 0; r < want.size(); ++r) {
    EXPECT_EQ(got[r].id, want[r].id);
    ASSERT_EQ(got[r].samples.size(), want[r].samples.size()) << want[r].id;
    for (size_t s = 0; s < want[r].samples.size(); ++s) {
      EXPECT_EQ(got[r].samples[s].tokens, want[r].samples[s].tokens) << want[r].id;
      EXPECT_EQ(got[r].samples[s].logprobs, want[r].samples[s].logprobs) << want[r].id;
      EXPECT_EQ(got[r].samples[s].versions, want[r].samples[s].versions) << want[r].id;
    }
  }
}

struct RolloutAhead : ::testing::Test {
  RolloutAhead() : sys{(actors::configure(cfg), cfg)} {}
  ~RolloutAhead() override {
    for (const auto& a : spawned)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
  caf::actor_system_config cfg;
  caf::actor_system sys;
  std::vector<rollout_actor> spawned;

  rollout_actor spawn(const models::llama_model& m, int64_t pace) {
    rollout_options o;
    o.pace = pace;
    o.threads = 1;
    auto r = spawn_rollout(sys, copy_of(m, models::head_kind::lm), ahead_engine(), o);
    EXPECT_TRUE(r) << describe(r.error());
    spawned.push_back(*r);
    return *r;
  }

  rollout_actor spawn_fleet(const models::llama_model& m, int size, int64_t pace) {
    std::vector<rollout_actor> replicas;
    for (int r = 0; r < size; ++r)
      replicas.push_back(spawn(m, pace));
    auto f = spawn_rollout_fleet(sys, replicas);
    EXPECT_TRUE(f) << describe(f.error());
    spawned.push_back(*f);
    return *f;
  }

  template <class R, class... Ts>
  expected<R> ask(const rollout_actor& r, Ts... xs) {
    return ask_rollout<R>(sys, r, xs...);
  }

  expected<std::vector<request_output>> collect(const rollout_actor& r,
                                                std::vector<std::string> ids) {
    auto g = ask<generation>(r, collect_atom::value, std::move(ids));
    if (!g)
      return g.error();
    return std::move(g->outputs);
  }
};

} // namespace

TEST_F(RolloutAhead, BatchesAheadAreCollectedInTheCallersOrderOnce) {
  auto m = tiny_model(1);
  auto rollout = spawn(m, 0);
  auto reqs = ahead_batch("a", 3, 4);
  auto queued = ask<int64_t>(rollout, generate_atom::value, ahead_atom::value, reqs);
  ASSERT_TRUE(queued) << describe(queued.error());
  EXPECT_EQ(*queued, 3);
  auto want = make_engine(copy_of(m, models::head_kind::lm), ahead_engine())->generate(reqs);
  ASSERT_TRUE(want);
  auto got = collect(rollout, {"a2", "a0"});
  ASSERT_TRUE(got) << describe(got.error());
  expect_same_ahead({(*want)[2], (*want)[0]}, *got);
  got = collect(rollout, {"a1"});
  ASSERT_TRUE(got) << describe(got.error());
  expect_same_ahead({(*want)[1]}, *got);
  for (const char* id : {"a1", "zz"}) {
    auto again = collect(rollout, {id});
    ASSERT_FALSE(again) << id;
    EXPECT_EQ(code_of(again.error()), errc::not_found);
    EXPECT_NE(describe(again.error()).find("'" + std::string{id} + "' was not generated ahead"),
              std::string::npos);
  }
}

// NOTE [paced rollout]: with pace 3 the version loads after exactly three
// steps of the batch ahead (the prompt with the first token, then two),
// whether it arrives at once or long after the steps ran; the rollout
// then waits for a reason to step.
TEST_F(RolloutAhead, APacedRolloutTakesTheVersionAfterItsStepsHoweverLateItArrives) {
  auto v0 = tiny_model(1), v1 = tiny_model(2);
  std::vector<std::vector<int64_t>> tokens;
  for (auto delay : {std::chrono::milliseconds(0), std::chrono::milliseconds(300)}) {
    SCOPED_TRACE(delay.count());
    auto rollout = spawn(v0, 3);
    ASSERT_TRUE(ask<int64_t>(rollout, generate_atom::value, ahead_atom::value,
                             std::vector<generate_request>{{"p", {1, 2, 3}, greedy(8)}}));
    std::this_thread::sleep_for(delay);
    auto loaded = ask<int64_t>(rollout, load_weights_atom::value, int64_t{1}, weights_of(v1));
    ASSERT_TRUE(loaded) << describe(loaded.error());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    auto m = ask<engine_metrics>(rollout, metrics_atom::value);
    ASSERT_TRUE(m);
    EXPECT_EQ(m->steps, 3) << "three steps, then it waits";
    auto outs = collect(rollout, {"p"});
    ASSERT_TRUE(outs) << describe(outs.error());
    EXPECT_EQ(outs->at(0).samples[0].versions, (std::vector<int64_t>{0, 0, 0, 1, 1, 1, 1, 1}));
    tokens.push_back(outs->at(0).samples[0].tokens);
  }
  EXPECT_EQ(tokens[0], tokens[1]);
}

// NOTE [batches ahead]: a paced rollout's snapshot, restored into a fresh
// rollout at the same version, finishes its batch ahead as the original
// does; a rollout that holds requests refuses one.
TEST_F(RolloutAhead, ASnapshotRestoredIntoAnotherRolloutFinishesAsTheOriginal) {
  auto v0 = tiny_model(1), v1 = tiny_model(2);
  auto reqs = ahead_batch("s", 4, 8);
  auto original = spawn(v0, 2);
  ASSERT_TRUE(ask<int64_t>(original, generate_atom::value, ahead_atom::value, reqs));
  ASSERT_TRUE(ask<int64_t>(original, load_weights_atom::value, int64_t{1}, weights_of(v1)));
  auto snap = ask<std::string>(original, snapshot_atom::value);
  ASSERT_TRUE(snap) << describe(snap.error());

  auto copy = spawn(v0, 2);
  ASSERT_TRUE(ask<int64_t>(copy, load_weights_atom::value, int64_t{1}, weights_of(v1)));
  auto ids = ask<std::vector<std::string>>(copy, restore_atom::value, *snap);
  ASSERT_TRUE(ids) << describe(ids.error());
  EXPECT_EQ(ids->size(), reqs.size());
  auto want = collect(original, ids_of(reqs));
  auto got = collect(copy, ids_of(reqs));
  ASSERT_TRUE(want && got);
  expect_same_ahead(*want, *got);
  EXPECT_EQ(want->at(0).samples[0].versions.front(), 0) << "begun under version 0";

  auto busy = spawn(v0, 0);
  ASSERT_TRUE(ask<int64_t>(busy, generate_atom::value, ahead_atom::value, ahead_batch("b", 1, 3)));
  auto refused = ask<std::vector<std::string>>(busy, restore_atom::value, *snap);
  ASSERT_FALSE(refused);
  EXPECT_EQ(code_of(refused.error()), errc::illegal_state);
}

// A fleet's snapshot holds each replica's; it goes back into a fleet of as
// many replicas (each request to the replica that held it), never another.
TEST_F(RolloutAhead, AFleetSnapshotGoesBackIntoAFleetOfAsManyReplicas) {
  auto v0 = tiny_model(1), v1 = tiny_model(2);
  auto reqs = ahead_batch("f", 5, 2);
  auto fleet = spawn_fleet(v0, 2, 2);
  ASSERT_TRUE(ask<int64_t>(fleet, generate_atom::value, ahead_atom::value, reqs));
  ASSERT_TRUE(ask<int64_t>(fleet, load_weights_atom::value, int64_t{1}, weights_of(v1)));
  auto snap = ask<std::string>(fleet, snapshot_atom::value);
  ASSERT_TRUE(snap) << describe(snap.error());

  auto three = spawn_fleet(v0, 3, 2);
  auto refused = ask<std::vector<std::string>>(three, restore_atom::value, *snap);
  ASSERT_FALSE(refused);
  EXPECT_NE(describe(refused.error()).find("holds 2 replicas, this rollout has 3"),
            std::string::npos)
      << describe(refused.error());

  auto two = spawn_fleet(v0, 2, 2);
  ASSERT_TRUE(ask<int64_t>(two, load_weights_atom::value, int64_t{1}, weights_of(v1)));
  auto ids = ask<std::vector<std::string>>(two, restore_atom::value, *snap);
  ASSERT_TRUE(ids) << describe(ids.error());
  EXPECT_EQ(ids->size(), reqs.size());
  auto want = collect(fleet, ids_of(reqs));
  auto got = collect(two, ids_of(reqs));
  ASSERT_TRUE(want) << describe(want.error());
  ASSERT_TRUE(got) << describe(got.error());
  expect_same_ahead(*want, *got);
}
