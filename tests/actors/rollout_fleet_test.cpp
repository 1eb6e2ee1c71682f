// NOTE [rollout fleet] (actors/inference/rollout_group.hpp): the rollout's
// dp replicas, independent engines behind one handle — what the rollout
// role of a job with `placement.roles[rollout].dp: 2` talks to. A call is
// split by request index; in the batch-invariant mode the fleet's answers
// equal one engine's bit for bit; a request that extends an earlier one
// goes where that one was generated; weight versions reach every replica;
// a replica's end ends the fleet.
#include "actors/actor_system.hpp"
#include "actors/inference/rollout_group.hpp"
#include "models/llama.hpp"
#include "tests/actors/rollout_calls.hpp"
#include "tests/actors/tiny_engine.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

using namespace troupe;
using namespace troupe::actors::inference;
using namespace troupe::actors::inference::testing;

namespace {

constexpr auto kTimeout = std::chrono::seconds(60);

engine_config invariant_engine() {
  engine_config c;
  c.num_blocks = 64;
  c.block_size = 4;
  c.batch_invariant = true; // a request's bits do not depend on its batch
  return c;
}

std::vector<generate_request> fleet_batch(const std::string& prefix, int count, uint64_t seed) {
  std::vector<generate_request> out;
  for (int i = 0; i < count; ++i) {
    std::vector<int64_t> prompt;
    for (int t = 0; t < 2 + i % 4; ++t)
      prompt.push_back((5 * t + 3 * i + static_cast<int>(seed)) % 50);
    out.push_back({prefix + std::to_string(i), prompt,
                   random_sampling(6 + i % 5, seed + static_cast<uint64_t>(i))});
  }
  out[1].sampling.n = 3; // forked samples stay on their request's replica
  return out;
}

void expect_same(const std::vector<request_output>& want, const std::vector<request_output>& got,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r < want.size(); ++r) {
    EXPECT_EQ(got[r].id, want[r].id) << what;
    EXPECT_EQ(got[r].weight_version, want[r].weight_version) << what;
    ASSERT_EQ(got[r].samples.size(), want[r].samples.size()) << what;
    for (size_t s = 0; s < want[r].samples.size(); ++s) {
      EXPECT_EQ(got[r].samples[s].tokens, want[r].samples[s].tokens) << what << ", request " << r;
      EXPECT_EQ(got[r].samples[s].logprobs, want[r].samples[s].logprobs) // bit for bit
          << what << ", request " << r;
    }
  }
}

struct RolloutFleet : ::testing::Test {
  RolloutFleet() : sys{(actors::configure(cfg), cfg)} {}
  caf::actor_system_config cfg;
  caf::actor_system sys;
  std::vector<rollout_actor> replicas;

  rollout_actor spawn_fleet(const models::llama_model& dense, int size) {
    replicas.clear();
    for (int r = 0; r < size; ++r) {
      rollout_options o;
      o.threads = 1;
      auto a = spawn_rollout(sys, copy_of(dense, models::head_kind::lm), invariant_engine(), o);
      EXPECT_TRUE(a) << describe(a.error());
      replicas.push_back(*a);
    }
    auto f = spawn_rollout_fleet(sys, replicas);
    EXPECT_TRUE(f) << describe(f.error());
    return *f;
  }

  template <class R, class... Ts>
  expected<R> ask(const caf::actor& r, Ts... xs) {
    caf::scoped_actor self{sys};
    expected<R> out = make_error(errc::timeout, "no answer");
    self->request(r, kTimeout, xs...)
        .receive([&](R& x) { out = std::move(x); }, [&](caf::error& e) { out = std::move(e); });
    return out;
  }
  template <class R, class... Ts>
  expected<R> ask(const rollout_actor& r, Ts... xs) {
    return ask<R>(caf::actor_cast<caf::actor>(r), xs...);
  }
};

} // namespace

TEST(FleetSlice, ContiguousAndTheFirstReplicasTakeTheRemainder) {
  std::vector<std::pair<size_t, size_t>> got;
  for (size_t r = 0; r < 3; ++r)
    got.push_back(fleet_slice(7, 3, r));
  EXPECT_EQ(got, (std::vector<std::pair<size_t, size_t>>{{0, 3}, {3, 5}, {5, 7}}));
  EXPECT_EQ(fleet_slice(1, 2, 1), (std::pair<size_t, size_t>{1, 1})); // an empty slice
  EXPECT_EQ(fleet_slice(8, 2, 1), (std::pair<size_t, size_t>{4, 8}));
}

// Two replicas, two callers at once: each caller gets exactly what one
// engine generates for its requests, and each replica did part of the work.
TEST_F(RolloutFleet, TwoReplicasGenerateWhatOneEngineDoesBitForBit) {
  auto dense = tiny_model(61);
  auto fleet = spawn_fleet(dense, 2);
  auto a = fleet_batch("a", 5, 100), b = fleet_batch("b", 3, 200);
  auto want_a = make_engine(copy_of(dense, models::head_kind::lm), invariant_engine())->generate(a);
  auto want_b = make_engine(copy_of(dense, models::head_kind::lm), invariant_engine())->generate(b);
  ASSERT_TRUE(want_a && want_b);
  caf::scoped_actor self{sys};
  auto ra = self->request(fleet, kTimeout, generate_atom::value, a);
  auto rb = self->request(fleet, kTimeout, generate_atom::value, b);
  std::vector<request_output> got_a, got_b;
  engine_metrics seen;
  ra.receive([&](generation& g) { got_a = std::move(g.outputs); },
             [&](caf::error& e) { FAIL() << describe(e); });
  rb.receive(
      [&](generation& g) {
        got_b = std::move(g.outputs);
        seen = g.engine;
      },
      [&](caf::error& e) { FAIL() << describe(e); });
  expect_same(*want_a, got_a, "caller a");
  expect_same(*want_b, got_b, "caller b");
  int64_t tokens = 0;
  std::vector<int64_t> finished;
  for (const auto& r : replicas) {
    auto m = ask<engine_metrics>(r, metrics_atom::value);
    ASSERT_TRUE(m) << describe(m.error());
    finished.push_back(m->finished_requests);
    tokens += m->generated_tokens;
  }
  EXPECT_EQ(finished, (std::vector<int64_t>{3 + 2, 2 + 1})) << "5 and 3 requests, split";
  auto sum = ask<engine_metrics>(fleet, metrics_atom::value);
  ASSERT_TRUE(sum) << describe(sum.error());
  EXPECT_EQ(sum->generated_tokens, tokens);
  EXPECT_EQ(sum->finished_requests, 8);
  EXPECT_GT(seen.generated_tokens, 0);
  caf::anon_send_exit(fleet, caf::exit_reason::user_shutdown);
}

// NOTE [token-in, token-out]: a continuation goes to the replica that holds
// the sequence it extends — wherever the split would put it.
TEST_F(RolloutFleet, AContinuationGoesToTheReplicaThatGeneratedItsSequence) {
  auto dense = tiny_model(62);
  auto fleet = spawn_fleet(dense, 2);
  auto one = make_engine(copy_of(dense, models::head_kind::lm), invariant_engine());
  auto first = fleet_batch("t", 4, 300);
  auto want = one->generate(first);
  auto got = generate_on(sys, fleet, first, kTimeout);
  ASSERT_TRUE(want && got) << (got ? "" : describe(got.error()));
  expect_same(*want, *got, "first turns");
  // t3 was generated by replica 1; alone in a call the split sends a
  // request to replica 0 — its continuation must still reach replica 1.
  std::vector<generate_request> next{{"t3.1", {7, 8}, random_sampling(5, 9), "t3"}};
  auto want_next = one->generate(next);
  auto got_next = generate_on(sys, fleet, next, kTimeout);
  ASSERT_TRUE(want_next && got_next) << (got_next ? "" : describe(got_next.error()));
  expect_same(*want_next, *got_next, "the continuation");
  EXPECT_EQ(got_next->front().prompt.size(),
            first[3].prompt.size() + want->at(3).samples[0].tokens.size() + 2);
  caf::anon_send_exit(fleet, caf::exit_reason::user_shutdown);
}

// A weight version reaches every replica: after it, every request — on
// whichever replica — is generated by the new weights.
TEST_F(RolloutFleet, WeightVersionsReachEveryReplica) {
  auto dense = tiny_model(63), v1 = tiny_model(64);
  auto fleet = spawn_fleet(dense, 2);
  auto w1 =
      std::make_shared<const std::map<std::string, at::Tensor>>(models::export_hf_weights(v1));
  auto loaded =
      ask<int64_t>(fleet, load_weights_atom::value, int64_t{1}, actors::shared_weights{w1});
  ASSERT_TRUE(loaded) << describe(loaded.error());
  EXPECT_EQ(*loaded, 1);
  auto reqs = fleet_batch("w", 4, 400);
  auto one = make_engine(copy_of(v1, models::head_kind::lm), invariant_engine());
  ASSERT_TRUE(one->load_weights(1, models::export_hf_weights(v1)));
  auto want = one->generate(reqs);
  auto got = generate_on(sys, fleet, reqs, kTimeout);
  ASSERT_TRUE(want && got) << (got ? "" : describe(got.error()));
  expect_same(*want, *got, "version 1");
  actors::weight_channel bc;
  bc.kind = runtime::transport_kind::broadcast;
  auto refused = ask<actors::sync_bytes>(fleet, receive_weights_atom::value, int64_t{2}, bc);
  ASSERT_FALSE(refused);
  EXPECT_NE(describe(refused.error()).find("reaches one receiver"), std::string::npos)
      << describe(refused.error());
  auto freed = ask<int64_t>(fleet, actors::release_atom::value);
  ASSERT_TRUE(freed) << describe(freed.error());
  auto one_pool = ask<int64_t>(replicas[0], actors::release_atom::value);
  ASSERT_TRUE(one_pool) << describe(one_pool.error());
  EXPECT_EQ(*one_pool, 0) << "released already, by the fleet";
  EXPECT_GT(*freed, 0);
  caf::anon_send_exit(fleet, caf::exit_reason::user_shutdown);
}

// A replica that ends ends the fleet with its reason, and an open call
// fails instead of waiting.
TEST_F(RolloutFleet, AReplicaThatEndsEndsTheFleetAndFailsOpenCalls) {
  auto dense = tiny_model(65);
  auto fleet = spawn_fleet(dense, 2);
  caf::scoped_actor self{sys};
  self->monitor(fleet);
  std::vector<generate_request> two{{"x", {1, 2, 3}, greedy(80)}, {"y", {4, 5}, greedy(80)}};
  auto call = self->request(fleet, kTimeout, generate_atom::value, two);
  caf::anon_send_exit(replicas[1], caf::exit_reason::kill);
  bool failed = false;
  call.receive([&](generation&) {}, [&](caf::error&) { failed = true; });
  EXPECT_TRUE(failed);
  bool down = false;
  self->receive([&](caf::down_msg& dm) { down = dm.source == fleet.address() && dm.reason; },
                caf::after(kTimeout) >> [] {});
  EXPECT_TRUE(down);
}
