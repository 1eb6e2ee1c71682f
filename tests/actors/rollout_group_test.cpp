// NOTE [rollout group] (actors/inference/rollout_group.hpp): a tensor-
// parallel rollout's ranks, each a driven rollout actor on its part of the
// model, behind one handle — what the rollout role of a job with
// `placement.roles[rollout].tp: 2` talks to. Its answers equal one rollout
// actor's on the whole model, with callers joining the running batch
// between steps, weight versions loading into every rank's part, and a
// rank's end ending the group.
#include "actors/actor_system.hpp"
#include "actors/inference/rollout_group.hpp"
#include "actors/role_proxy.hpp"
#include "models/llama.hpp"
#include "models/tensor_parallel.hpp"
#include "runtime/collectives.hpp"
#include "runtime/shm_collectives.hpp"
#include "runtime/weight_transport.hpp"
#include "tests/actors/rollout_calls.hpp"
#include "tests/actors/tiny_engine.hpp"
#include "tests/support/ranks.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

using namespace troupe;
using namespace troupe::actors::inference;
using namespace troupe::actors::inference::testing;

namespace {

constexpr auto kGroupTimeout = std::chrono::seconds(60);

engine_config group_engine() {
  engine_config c;
  c.num_blocks = 24; // small enough that long batches preempt
  c.block_size = 4;
  return c;
}

std::vector<generate_request> group_batch(const std::string& prefix, int count, uint64_t seed,
                                          bool sampled) {
  std::vector<generate_request> out;
  for (int i = 0; i < count; ++i) {
    std::vector<int64_t> prompt;
    for (int t = 0; t < 3 + 2 * i; ++t)
      prompt.push_back((7 * t + 3 * i + static_cast<int>(seed)) % 50);
    out.push_back(
        {prefix + std::to_string(i), prompt,
         sampled ? random_sampling(8 + i, seed + static_cast<uint64_t>(i)) : greedy(8 + i)});
  }
  out[1].sampling.n = 2; // forked samples share the prompt's blocks on every rank
  return out;
}

void expect_like(const std::vector<request_output>& want, const std::vector<request_output>& got,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r < want.size(); ++r) {
    EXPECT_EQ(got[r].id, want[r].id) << what;
    ASSERT_EQ(got[r].samples.size(), want[r].samples.size()) << what;
    for (size_t s = 0; s < want[r].samples.size(); ++s) {
      const auto &a = want[r].samples[s], &b = got[r].samples[s];
      EXPECT_EQ(b.tokens, a.tokens) << what << ", request " << r << " sample " << s;
      ASSERT_EQ(b.logprobs.size(), a.logprobs.size()) << what;
      for (size_t t = 0; t < a.logprobs.size(); ++t)
        EXPECT_NEAR(b.logprobs[t], a.logprobs[t], 1e-4) << what << ", request " << r;
    }
  }
}

struct RolloutGroup : ::testing::Test {
  RolloutGroup() : sys{(actors::configure(cfg), cfg)} {}
  // The ranks' TP groups (shared memory over gloo, as a job's), declared
  // first: they outlive the actor system, whose end waits for the ranks.
  std::unique_ptr<runtime::local_groups> world;
  std::vector<std::unique_ptr<runtime::process_group>> tp;
  caf::actor_system_config cfg;
  caf::actor_system sys;
  std::vector<rollout_actor> ranks;

  // A group of `size` driven ranks, each on its part of `dense` (once a
  // test).

  rollout_actor spawn_group(const models::llama_model& dense, int size, bool proxied = false) {
    runtime::group_options go;
    go.name = "rollout-group-test";
    go.timeout_ms = 10000; // a rank left alone in a sum gives up soon
    auto w = runtime::make_local_groups(size, go);
    EXPECT_TRUE(w) << describe(w.error());
    world = std::make_unique<runtime::local_groups>(std::move(*w));
    tp.resize(static_cast<size_t>(size));
    auto parts = troupe::testing::on_every_rank<models::llama_model>(
        world->groups, [&](runtime::process_group& gloo) -> models::llama_model {
          const auto rank = static_cast<size_t>(gloo.rank());
          auto shm = runtime::with_shm_collectives(std::move(gloo), world->stores[rank],
                                                   "rollout-group", 1 << 20, go.timeout_ms);
          EXPECT_TRUE(shm) << describe(shm.error());
          tp[rank] = std::make_unique<runtime::process_group>(std::move(*shm));
          auto part = models::partition_llama(dense->config(), *tp[rank]);
          EXPECT_TRUE(part) << describe(part.error());
          auto model = models::make_model_part(dense, *part);
          EXPECT_TRUE(model) << describe(model.error());
          return *model;
        });
    ranks.clear();
    for (auto& m : parts) {
      rollout_options o;
      o.driven = true;
      o.threads = 1;
      auto r = spawn_rollout(sys, m, group_engine(), o);
      EXPECT_TRUE(r) << describe(r.error());
      ranks.push_back(*r);
    }
    auto members = ranks;
    if (proxied) // as a job's remote ranks are reached (NOTE [role proxy])
      for (auto& r : members)
        r = caf::actor_cast<rollout_actor>(
            actors::spawn_role_proxy(sys, caf::actor_cast<caf::actor>(r), "rollout rank"));
    auto g = spawn_rollout_group(sys, members);
    EXPECT_TRUE(g) << describe(g.error());
    return *g;
  }

  expected<std::vector<request_output>> generate(const rollout_actor& r,
                                                 std::vector<generate_request> reqs) {
    return generate_on(sys, r, std::move(reqs), kGroupTimeout);
  }

  template <class R, class... Ts>
  expected<R> ask(const rollout_actor& r, Ts... xs) {
    caf::scoped_actor self{sys};
    expected<R> out = make_error(errc::timeout, "no answer");
    self->request(r, kGroupTimeout, xs...)
        .receive([&](R& x) { out = std::move(x); }, [&](caf::error& e) { out = std::move(e); });
    return out;
  }
};

} // namespace

// Two callers at once: the second call's requests join the running batch
// between steps on both ranks alike; each caller gets what one engine on
// the whole model generates for its requests (greedy and seeded sampling).
TEST_F(RolloutGroup, TwoRanksGenerateWhatOneEngineDoesForConcurrentCallers) {
  auto dense = tiny_model(51);
  auto group = spawn_group(dense, 2);
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "sampled" : "greedy");
    auto a = group_batch("a", 4, 100, sampled), b = group_batch("b", 3, 200, sampled);
    auto want_a = make_engine(dense, group_engine())->generate(a);
    auto want_b = make_engine(dense, group_engine())->generate(b);
    ASSERT_TRUE(want_a && want_b);
    caf::scoped_actor self{sys};
    auto ra = self->request(group, kGroupTimeout, generate_atom::value, a);
    auto rb = self->request(group, kGroupTimeout, generate_atom::value, b);
    std::vector<request_output> got_a, got_b;
    ra.receive([&](generation& g) { got_a = std::move(g.outputs); },
               [&](caf::error& e) { FAIL() << describe(e); });
    rb.receive([&](generation& g) { got_b = std::move(g.outputs); },
               [&](caf::error& e) { FAIL() << describe(e); });
    expect_like(*want_a, got_a, "caller a");
    expect_like(*want_b, got_b, "caller b");
    auto m = ask<engine_metrics>(group, metrics_atom::value);
    ASSERT_TRUE(m) << describe(m.error());
    EXPECT_GT(m->steps, 0);
    EXPECT_GT(m->generated_tokens, 0);
  }
  caf::anon_send_exit(group, caf::exit_reason::user_shutdown);
}

// A caller that asks again as soon as it is answered: its requests reach
// the ranks while the group may still be waiting for the ranks' "no work"
// answers to the round before (which predate them); the group drives
// again, so no call is left waiting. Through role proxies, as in a job.
TEST_F(RolloutGroup, BackToBackCallsThroughProxiesAreAllAnswered) {
  auto dense = tiny_model(56);
  auto group = spawn_group(dense, 2, /*proxied=*/true);
  auto engine = make_engine(dense, group_engine());
  for (int i = 0; i < 30; ++i) {
    std::vector<generate_request> one{
        {"q" + std::to_string(i), {1 + i % 40, 2, 3}, greedy(1 + i % 3)}};
    auto want = engine->generate(one);
    auto got = generate(group, one);
    ASSERT_TRUE(want && got) << "call " << i << ": " << (got ? "" : describe(got.error()));
    expect_like(*want, *got, "call " + std::to_string(i));
  }
  caf::anon_send_exit(group, caf::exit_reason::user_shutdown);
}

// NOTE [batches ahead]: a TP group queues requests ahead on every rank and
// collects what one engine on the whole model generates; its snapshot
// (each rank's part, taken between the same steps) put back into it
// finishes them again the same way. Through role proxies, as in a job.
TEST_F(RolloutGroup, BatchesAheadAreCollectedAndTheGroupsSnapshotGoesBack) {
  auto dense = tiny_model(57);
  auto group = spawn_group(dense, 2, /*proxied=*/true);
  auto reqs = group_batch("h", 3, 300, true);
  auto want = make_engine(dense, group_engine())->generate(reqs);
  ASSERT_TRUE(want);
  auto queued = ask<int64_t>(group, generate_atom::value, ahead_atom::value, reqs);
  ASSERT_TRUE(queued) << describe(queued.error());
  EXPECT_EQ(*queued, 3);
  auto snap = ask<std::string>(group, snapshot_atom::value);
  ASSERT_TRUE(snap) << describe(snap.error());
  std::vector<std::string> ids{"h0", "h1", "h2"};
  auto first = ask<generation>(group, collect_atom::value, ids);
  ASSERT_TRUE(first) << describe(first.error());
  expect_like(*want, first->outputs, "collected");
  auto back = ask<std::vector<std::string>>(group, restore_atom::value, *snap);
  ASSERT_TRUE(back) << describe(back.error());
  EXPECT_EQ(back->size(), 3u);
  auto again = ask<generation>(group, collect_atom::value, ids);
  ASSERT_TRUE(again) << describe(again.error());
  expect_like(*want, again->outputs, "restored and collected");
  caf::anon_send_exit(group, caf::exit_reason::user_shutdown);
}

// A weight version reaches every rank, whole, and each keeps its part: by
// load_weights (in process) and through a channel every rank receives
// from (alias); the broadcast channel, which reaches one receiver, is
// refused with the reason.
TEST_F(RolloutGroup, WeightVersionsReachEveryRanksPart) {
  auto dense = tiny_model(52), v1 = tiny_model(53), v2 = tiny_model(54);
  auto group = spawn_group(dense, 2);
  auto reqs = group_batch("r", 3, 7, false);

  auto w1 =
      std::make_shared<const std::map<std::string, at::Tensor>>(models::export_hf_weights(v1));
  auto loaded =
      ask<int64_t>(group, load_weights_atom::value, int64_t{1}, actors::shared_weights{w1});
  ASSERT_TRUE(loaded) << describe(loaded.error());
  EXPECT_EQ(*loaded, 1);
  auto want1 = make_engine(v1, group_engine())->generate(reqs);
  auto got1 = generate(group, reqs);
  ASSERT_TRUE(want1 && got1) << (got1 ? "" : describe(got1.error()));
  expect_like(*want1, *got1, "version 1");
  EXPECT_EQ(got1->front().weight_version, 1);

  runtime::transport_options to;
  to.kind = runtime::transport_kind::alias;
  to.channel = "rollout-group-test";
  auto publisher = runtime::make_weight_transport(to);
  ASSERT_TRUE(publisher) << describe(publisher.error());
  ASSERT_TRUE((*publisher)->publish(2, models::export_hf_weights(v2)));
  actors::weight_channel ch;
  ch.kind = runtime::transport_kind::alias;
  ch.channel = to.channel;
  auto bytes = ask<actors::sync_bytes>(group, receive_weights_atom::value, int64_t{2}, ch);
  ASSERT_TRUE(bytes) << describe(bytes.error());
  int64_t whole = 0;
  for (const auto& [name, t] : models::export_hf_weights(v2))
    whole += static_cast<int64_t>(t.numel() * t.element_size());
  EXPECT_EQ(bytes->bytes, whole); // each rank received the whole version
  EXPECT_EQ(bytes->temporary, 0); // NOTE [sync staging]: the publisher's tensors
  auto want2 = make_engine(v2, group_engine())->generate(reqs);
  auto got2 = generate(group, reqs);
  ASSERT_TRUE(want2 && got2) << (got2 ? "" : describe(got2.error()));
  expect_like(*want2, *got2, "version 2");

  // Through shared memory each rank maps the whole version while it loads
  // its part: that is its temporary memory.
  to.kind = ch.kind = runtime::transport_kind::shm;
  to.channel = ch.channel = "rollout-group-test-shm-" + std::to_string(::getpid());
  auto shm = runtime::make_weight_transport(to);
  ASSERT_TRUE(shm) << describe(shm.error());
  ASSERT_TRUE((*shm)->publish(3, models::export_hf_weights(v1)));
  auto mapped = ask<actors::sync_bytes>(group, receive_weights_atom::value, int64_t{3}, ch);
  ASSERT_TRUE(mapped) << describe(mapped.error());
  EXPECT_EQ(mapped->bytes, whole);
  EXPECT_EQ(mapped->temporary, whole);
  auto got3 = generate(group, reqs);
  ASSERT_TRUE(got3) << describe(got3.error());
  expect_like(*want1, *got3, "version 3 (version 1's weights)");

  actors::weight_channel bc;
  bc.kind = runtime::transport_kind::broadcast;
  auto refused = ask<actors::sync_bytes>(group, receive_weights_atom::value, int64_t{4}, bc);
  ASSERT_FALSE(refused);
  EXPECT_NE(describe(refused.error()).find("reaches one receiver"), std::string::npos)
      << describe(refused.error());

  auto freed = ask<int64_t>(group, actors::release_atom::value);
  ASSERT_TRUE(freed) << describe(freed.error());
  EXPECT_GT(*freed, 0); // both ranks' KV pools
  caf::anon_send_exit(group, caf::exit_reason::user_shutdown);
}

// A rank that ends ends the group with its reason, and an open call fails
// instead of waiting for a peer that is gone.
TEST_F(RolloutGroup, ARankThatEndsEndsTheGroupAndFailsOpenCalls) {
  auto dense = tiny_model(55);
  auto group = spawn_group(dense, 2);
  caf::scoped_actor self{sys};
  self->monitor(group);
  std::vector<generate_request> long_one{{"long", {1, 2, 3}, greedy(80)}};
  auto call = self->request(group, kGroupTimeout, generate_atom::value, long_one);
  caf::anon_send_exit(ranks[1], caf::exit_reason::kill);
  bool failed = false;
  call.receive([&](generation&) {}, [&](caf::error&) { failed = true; });
  EXPECT_TRUE(failed);
  bool down = false;
  self->receive([&](caf::down_msg& dm) { down = dm.source == group.address() && dm.reason; },
                caf::after(kGroupTimeout) >> [] {});
  EXPECT_TRUE(down);
}
