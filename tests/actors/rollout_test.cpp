#include "actors/actor_system.hpp"
#include "actors/inference/rollout.hpp"
#include "models/llama.hpp"
#include "tests/actors/rollout_calls.hpp"
#include "tests/actors/tiny_engine.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <string>
#include <vector>

using namespace troupe;
using namespace troupe::actors::inference;
using namespace troupe::actors::inference::testing;

namespace {

constexpr auto kRolloutTimeout = std::chrono::seconds(60);

struct rollout_fixture : ::testing::Test {
  rollout_fixture() : sys{(actors::configure(cfg), cfg)} {}
  caf::actor_system_config cfg;
  caf::actor_system sys;

  engine_config small_engine() {
    engine_config c;
    c.num_blocks = 64;
    c.block_size = 4;
    return c;
  }

  rollout_actor spawn(models::llama_model m) {
    auto r = spawn_rollout(sys, std::move(m), small_engine());
    EXPECT_TRUE(r) << describe(r.error());
    return *r;
  }

  expected<std::vector<request_output>> generate(const rollout_actor& r,
                                                 std::vector<generate_request> reqs) {
    return generate_on(sys, r, std::move(reqs), kRolloutTimeout);
  }
};

std::vector<generate_request> rollout_batch(const std::string& prefix, int count, uint64_t seed) {
  std::vector<generate_request> out;
  for (int i = 0; i < count; ++i) {
    std::vector<int64_t> prompt;
    for (int t = 0; t < 3 + i; ++t)
      prompt.push_back((7 * t + 3 * i + static_cast<int>(seed)) % 50);
    out.push_back({prefix + std::to_string(i), prompt,
                   random_sampling(6 + i, seed + static_cast<uint64_t>(i))});
  }
  return out;
}

std::vector<std::vector<int64_t>> tokens_of(const std::vector<request_output>& outs) {
  std::vector<std::vector<int64_t>> t;
  for (const auto& o : outs)
    t.push_back(o.samples.at(0).tokens);
  return t;
}

} // namespace

TEST_F(rollout_fixture, concurrent_callers_share_steps_and_get_their_own_outputs) {
  auto m = tiny_model();
  auto a = rollout_batch("a", 3, 100), b = rollout_batch("b", 4, 200);
  // The first call runs long enough (some 50 steps) that the second joins
  // it even when the test's thread is slow to send it (a busy machine).
  for (auto& r : a)
    r.sampling.max_tokens += 40;
  // References: each call alone on a plain engine, and its step count.
  auto alone_a = make_engine(m, small_engine());
  auto ref_a = alone_a->generate(a);
  auto alone_b = make_engine(m, small_engine());
  auto ref_b = alone_b->generate(b);
  ASSERT_TRUE(ref_a && ref_b);

  auto rollout = spawn(tiny_model());
  caf::scoped_actor self{sys};
  // Both calls are queued before the rollout finishes the first: they join
  // one running batch. Answers come back as ordinary messages.
  self->send(rollout, generate_atom::value, a);
  self->send(rollout, generate_atom::value, b);
  std::map<std::string, std::vector<request_output>> got;
  std::vector<engine_metrics> answered; // the engine's counters on each answer
  for (int i = 0; i < 2; ++i)
    self->receive(
        [&](generation& g) {
          answered.push_back(g.engine);
          got[g.outputs.at(0).id] = std::move(g.outputs);
        },
        [&](caf::error& e) { FAIL() << sys.render(e); },
        caf::after(kRolloutTimeout) >> [&] { FAIL() << "rollout did not answer"; });
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(tokens_of(got["a0"]), tokens_of(*ref_a));
  EXPECT_EQ(tokens_of(got["b0"]), tokens_of(*ref_b));
  for (size_t i = 0; i < got["b0"].size(); ++i)
    EXPECT_EQ(got["b0"][i].id, b[i].id) << "outputs in request order";

  engine_metrics metrics;
  self->request(rollout, kRolloutTimeout, metrics_atom::value)
      .receive([&](engine_metrics& mm) { metrics = mm; },
               [&](caf::error& e) { FAIL() << sys.render(e); });
  EXPECT_LT(metrics.steps, alone_a->metrics().steps + alone_b->metrics().steps)
      << "the two calls ran in shared steps";
  EXPECT_EQ(metrics.finished_requests, 7);
  // Each answer carries the counters as they stood when it was sent: the
  // last one has every request finished and all the busy time so far.
  ASSERT_EQ(answered.size(), 2u);
  EXPECT_LE(answered[0].finished_requests, answered[1].finished_requests);
  EXPECT_EQ(answered[1].finished_requests, 7);
  EXPECT_EQ(answered[1].generated_tokens, metrics.generated_tokens);
  EXPECT_DOUBLE_EQ(answered[1].busy_seconds, metrics.busy_seconds);
  auto named = rollout_metrics(metrics);
  ASSERT_FALSE(named.empty());
  EXPECT_EQ(named.front().first, "rollout/tokens_per_s");
  EXPECT_GT(named.front().second, 0.0);
  self->send_exit(rollout, caf::exit_reason::user_shutdown);
}

TEST_F(rollout_fixture, a_bad_call_is_rejected_whole_and_the_rollout_keeps_serving) {
  auto m = tiny_model();
  auto rollout = spawn(m);
  auto reqs = rollout_batch("x", 3, 5);
  reqs[1].prompt.clear();
  auto bad = generate(rollout, reqs);
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("request 'x1': prompt: empty prompt"), std::string::npos)
      << describe(bad.error());
  // Nothing of the bad call was queued: the same ids are free again.
  auto good = generate(rollout, rollout_batch("x", 3, 5));
  ASSERT_TRUE(good) << describe(good.error());
  auto ref = make_engine(tiny_model(), small_engine())->generate(rollout_batch("x", 3, 5));
  ASSERT_TRUE(ref);
  EXPECT_EQ(tokens_of(*good), tokens_of(*ref));
  caf::anon_send_exit(rollout, caf::exit_reason::user_shutdown);
}

TEST_F(rollout_fixture, weight_updates_between_calls_match_a_fresh_engine) {
  auto rollout = spawn(tiny_model(1));
  auto before = generate(rollout, rollout_batch("w", 2, 9));
  ASSERT_TRUE(before);
  EXPECT_EQ(before->at(0).weight_version, 0);
  auto next = tiny_model(2);
  auto weights = std::make_shared<const std::map<std::string, at::Tensor>>(
      models::export_hf_weights(next));
  caf::scoped_actor self{sys};
  int64_t answered = -1;
  self->request(rollout, kRolloutTimeout, load_weights_atom::value, int64_t{3},
                actors::shared_weights{weights})
      .receive([&](int64_t v) { answered = v; }, [&](caf::error& e) { FAIL() << sys.render(e); });
  EXPECT_EQ(answered, 3);
  auto after = generate(rollout, rollout_batch("w", 2, 9));
  ASSERT_TRUE(after);
  EXPECT_EQ(after->at(0).weight_version, 3);
  auto fresh = make_engine(tiny_model(2), small_engine())->generate(rollout_batch("w", 2, 9));
  ASSERT_TRUE(fresh);
  EXPECT_EQ(tokens_of(*after), tokens_of(*fresh));
  // A stale version is refused and changes nothing.
  caf::error stale;
  self->request(rollout, kRolloutTimeout, load_weights_atom::value, int64_t{2},
                actors::shared_weights{weights})
      .receive([&](int64_t) {}, [&](caf::error& e) { stale = e; });
  EXPECT_TRUE(stale);
  caf::anon_send_exit(rollout, caf::exit_reason::user_shutdown);
}

// NOTE [in-flight update]: a version that arrives between a running
// request's decode steps is loaded there; the request continues, and its
// tokens carry the versions that sampled them. (Driven, so the steps
// before the load are exactly two.)
TEST_F(rollout_fixture, a_version_loaded_between_decode_steps_tags_the_tokens_after_it) {
  rollout_options o;
  o.driven = true;
  auto rollout = spawn_rollout(sys, tiny_model(1), small_engine(), o);
  ASSERT_TRUE(rollout) << describe(rollout.error());
  caf::scoped_actor self{sys};
  auto call = self->request(*rollout, kRolloutTimeout, generate_atom::value,
                            std::vector<generate_request>{{"g", {1, 2, 3}, greedy(6)}});
  auto drive = [&] {
    bool more = false;
    self->request(*rollout, kRolloutTimeout, drive_atom::value)
        .receive([&](bool m) { more = m; }, [&](caf::error& e) { FAIL() << describe(e); });
    return more;
  };
  EXPECT_TRUE(drive()); // the prompt and the first token
  EXPECT_TRUE(drive()); // the second
  auto weights = std::make_shared<const std::map<std::string, at::Tensor>>(
      models::export_hf_weights(tiny_model(2)));
  self->request(*rollout, kRolloutTimeout, load_weights_atom::value, int64_t{1},
                actors::shared_weights{weights})
      .receive([](int64_t) {}, [&](caf::error& e) { FAIL() << describe(e); });
  for (int i = 0; i < 10 && drive(); ++i) {
  }
  std::vector<request_output> outs;
  call.receive([&](generation& g) { outs = std::move(g.outputs); },
               [&](caf::error& e) { FAIL() << describe(e); });
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].samples[0].versions, (std::vector<int64_t>{0, 0, 1, 1, 1, 1}));
  EXPECT_EQ(outs[0].first_weight_version, 0);
  EXPECT_EQ(outs[0].weight_version, 1);
  caf::anon_send_exit(*rollout, caf::exit_reason::user_shutdown);
}

TEST_F(rollout_fixture, a_failing_step_fails_open_calls_and_the_actor_exits_with_the_error) {
  auto m = tiny_model();
  auto rollout = spawn(m);
  // Inject a fault: the model (shared with the actor, idle now) gets a weight
  // of the wrong shape, so the next forward throws inside the engine.
  {
    torch::NoGradGuard ng;
    for (auto& p : m->named_parameters())
      if (p.key() == "layers.0.attention.wq.weight")
        p.value().set_data(torch::zeros({3, 3}));
  }
  caf::scoped_actor self{sys};
  self->monitor(rollout);
  auto failed = generate(rollout, rollout_batch("f", 2, 1));
  ASSERT_FALSE(failed);
  EXPECT_NE(describe(failed.error()).find("rollout step"), std::string::npos)
      << describe(failed.error());
  bool down = false;
  self->receive([&](caf::down_msg& d) { down = d.reason == failed.error(); },
                caf::after(kRolloutTimeout) >> [] {});
  EXPECT_TRUE(down) << "the rollout exits with the step's error";
}
