// Messages that cross processes: every request and reply type of the role
// actors travels between two actor systems through CAF's middleman
// (serialised, sent over loopback TCP, rebuilt) and comes back equal.
#include "actors/actor_system.hpp"
#include "actors/inference/rollout.hpp"
#include "actors/rl/reward.hpp"
#include "actors/train/engine_actor.hpp"
#include "cluster/workers.hpp"
#include "runtime/tensor_batch.hpp"
#include "tests/cluster/networked_system.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>

using namespace troupe;

namespace {

// Two actor systems on loopback and, on the server, an actor that answers
// every role message type with what it received.
class RemoteMessages : public ::testing::Test {
protected:
  void SetUp() override {
    echo_ = server_.sys->spawn([](caf::event_based_actor*) -> caf::behavior {
      return {
          [](const runtime::tensor_batch& b) { return b; },
          [](const actors::weight_channel& c) { return c; },
          [](const std::vector<actors::inference::generate_request>& r) { return r; },
          [](const std::vector<actors::inference::request_output>& r) { return r; },
          [](const actors::inference::engine_metrics& m) { return m; },
          [](const actors::train::metric_map& m) { return m; },
          [](const actors::train::policy_update_options& o) { return o; },
          [](const actors::train::critic_update_options& o) { return o; },
          [](const actors::train::dpo_step_options& o) { return o; },
          [](const actors::rl::reward_request& r) { return r; },
      };
    });
    auto port = server_.sys->middleman().publish(echo_, 0, "127.0.0.1");
    ASSERT_TRUE(port) << server_.sys->render(port.error());
    auto remote = client_.sys->middleman().remote_actor("127.0.0.1", *port);
    ASSERT_TRUE(remote) << client_.sys->render(remote.error());
    remote_ = *remote;
    self_.emplace(*client_.sys);
  }
  // The systems wait for their actors when destroyed: stop the echo actor.
  void TearDown() override {
    self_.reset();
    caf::anon_send_exit(echo_, caf::exit_reason::user_shutdown);
  }

  // `value` sent to the echo actor, as it comes back.
  template <class T>
  T round_trip(const T& value) {
    T got{};
    bool ok = false;
    (*self_)
        ->request(remote_, std::chrono::seconds(10), value)
        .receive(
            [&](const T& x) {
              got = x;
              ok = true;
            },
            [&](caf::error& e) { ADD_FAILURE() << client_.sys->render(e); });
    EXPECT_TRUE(ok);
    return got;
  }

  static runtime::tensor_batch small_batch() {
    runtime::tensor_batch b;
    EXPECT_TRUE(b.set("tokens", torch::arange(10, torch::kLong).view({2, 5})));
    EXPECT_TRUE(b.set("old_logp", torch::randn({2, 5})));
    return b;
  }

  test::networked_system server_;
  test::networked_system client_;
  caf::actor echo_;
  caf::actor remote_;
  std::optional<caf::scoped_actor> self_;
};

} // namespace

// Each request and reply type of the role actors, each field set to a
// non-default value, comes back equal.
TEST_F(RemoteMessages, TensorBatchesAndWeightChannelsCrossIntact) {
  auto b = small_batch();
  auto got = round_trip(b);
  ASSERT_EQ(got.tensors().size(), 2u);
  for (const auto& [name, t] : b.tensors()) {
    auto g = got.get(name);
    ASSERT_TRUE(g) << name;
    EXPECT_TRUE(torch::equal(*g, t)) << name;
    // A real copy: the reply does not share the sender's storage.
    EXPECT_NE(g->data_ptr(), t.data_ptr()) << name;
  }
  actors::weight_channel c;
  c.kind = runtime::transport_kind::shm;
  c.channel = "job-7-rl";
  c.keep = 3;
  auto gc = round_trip(c);
  EXPECT_EQ(gc.kind, runtime::transport_kind::shm);
  EXPECT_EQ(gc.channel, "job-7-rl");
  EXPECT_EQ(gc.keep, 3);
}

TEST_F(RemoteMessages, GenerationRequestsOutputsAndEngineMetricsCrossIntact) {
  namespace inf = actors::inference;
  inf::generate_request req;
  req.id = "p-3";
  req.prompt = {1, 5, 9};
  req.sampling.temperature = 0.7;
  req.sampling.top_k = 5;
  req.sampling.top_p = 0.9;
  req.sampling.n = 4;
  req.sampling.max_tokens = 12;
  req.sampling.stop_token_ids = {2, 3};
  req.sampling.ignore_eos = true;
  req.sampling.seed = 123456789012345ULL;
  auto unseeded = req;
  unseeded.sampling.seed.reset();
  auto reqs = round_trip(std::vector<inf::generate_request>{req, unseeded});
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].id, "p-3");
  EXPECT_EQ(reqs[0].prompt, req.prompt);
  EXPECT_EQ(reqs[0].sampling.temperature, 0.7);
  EXPECT_EQ(reqs[0].sampling.top_k, 5);
  EXPECT_EQ(reqs[0].sampling.top_p, 0.9);
  EXPECT_EQ(reqs[0].sampling.n, 4);
  EXPECT_EQ(reqs[0].sampling.max_tokens, 12);
  EXPECT_EQ(reqs[0].sampling.stop_token_ids, req.sampling.stop_token_ids);
  EXPECT_TRUE(reqs[0].sampling.ignore_eos);
  EXPECT_EQ(reqs[0].sampling.seed, req.sampling.seed);
  EXPECT_FALSE(reqs[1].sampling.seed.has_value());

  inf::request_output out;
  out.id = "p-3";
  out.prompt = {1, 5};
  out.samples = {{{7, 8}, {-0.5f, -1.25f}, {5, 6}, "stop"}, {{9}, {-2.0f}, {6}, "length"}};
  out.weight_version = 6;
  out.first_weight_version = 5;
  out.ttft_ms = 1.5;
  out.latency_ms = 9.25;
  auto outs = round_trip(std::vector<inf::request_output>{out});
  ASSERT_EQ(outs.size(), 1u);
  EXPECT_EQ(outs[0].id, out.id);
  EXPECT_EQ(outs[0].prompt, out.prompt);
  ASSERT_EQ(outs[0].samples.size(), 2u);
  EXPECT_EQ(outs[0].samples[0].tokens, out.samples[0].tokens);
  EXPECT_EQ(outs[0].samples[0].logprobs, out.samples[0].logprobs);
  EXPECT_EQ(outs[0].samples[0].versions, (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(outs[0].samples[1].finish_reason, "length");
  EXPECT_EQ(outs[0].weight_version, 6);
  EXPECT_EQ(outs[0].first_weight_version, 5);
  EXPECT_EQ(outs[0].ttft_ms, 1.5);
  EXPECT_EQ(outs[0].latency_ms, 9.25);

  inf::engine_metrics m;
  m.steps = 1;
  m.prompt_tokens = 2;
  m.prefill_tokens_computed = 3;
  m.generated_tokens = 4;
  m.recomputed_tokens = 14;
  m.preemptions = 5;
  m.finished_requests = 6;
  m.busy_seconds = 7.5;
  m.ttft_ms_sum = 8.5;
  m.itl_ms_sum = 9.5;
  m.itl_count = 10;
  m.prefix_hit_rate = 0.25;
  m.kv_utilization = 0.75;
  m.running = 11;
  m.waiting = 12;
  m.num_blocks = 13;
  auto mm = round_trip(m);
  EXPECT_EQ(mm.recomputed_tokens, 14);
  EXPECT_EQ(std::tie(mm.steps, mm.prompt_tokens, mm.prefill_tokens_computed, mm.generated_tokens,
                     mm.preemptions, mm.finished_requests, mm.itl_count, mm.running, mm.waiting,
                     mm.num_blocks),
            std::tie(m.steps, m.prompt_tokens, m.prefill_tokens_computed, m.generated_tokens,
                     m.preemptions, m.finished_requests, m.itl_count, m.running, m.waiting,
                     m.num_blocks));
  EXPECT_EQ(
      std::tie(mm.busy_seconds, mm.ttft_ms_sum, mm.itl_ms_sum, mm.prefix_hit_rate,
               mm.kv_utilization),
      std::tie(m.busy_seconds, m.ttft_ms_sum, m.itl_ms_sum, m.prefix_hit_rate, m.kv_utilization));
}

TEST_F(RemoteMessages, TrainingOptionsAndMetricsCrossIntact) {
  actors::train::metric_map metrics{{"actor/pg_loss", -0.5}, {"critic/vf_loss", 2.0}};
  EXPECT_EQ(round_trip(metrics), metrics);

  // Every field of the loss spec crosses, the dual clip both set and unset.
  for (std::optional<double> dual : {std::optional<double>{2.5}, std::optional<double>{}}) {
    actors::train::policy_update_options po;
    po.epochs = 2;
    po.minibatches = 4;
    po.loss.kind = kernels::policy_loss_kind::cispo;
    po.loss.options.clip_low = 0.3;
    po.loss.options.clip_high = 0.28;
    po.loss.options.dual_clip_c = dual;
    po.loss.options.agg = kernels::loss_agg_mode::seq_mean_token_sum_norm;
    po.loss.options.loss_scale_factor = 12;
    po.loss.entropy_coef = 0.01;
    po.temperature = 0.8;
    po.loss.kl_coef = 0.05;
    po.loss.kl = kernels::kl_estimator::k3_st;
    po.shuffle_seed = 99;
    po.shuffle = false;
    po.lr = 1e-4;
    auto pg = round_trip(po);
    const auto &a = pg.loss, &b = po.loss;
    EXPECT_EQ(
        std::tie(pg.epochs, pg.minibatches, a.kind, a.options.clip_low, a.options.clip_high,
                 a.options.dual_clip_c, a.options.agg, a.options.loss_scale_factor, a.entropy_coef,
                 pg.temperature, a.kl_coef, a.kl, pg.shuffle_seed, pg.shuffle, pg.lr),
        std::tie(po.epochs, po.minibatches, b.kind, b.options.clip_low, b.options.clip_high,
                 b.options.dual_clip_c, b.options.agg, b.options.loss_scale_factor, b.entropy_coef,
                 po.temperature, b.kl_coef, b.kl, po.shuffle_seed, po.shuffle, po.lr));
  }

  actors::train::dpo_step_options dpo;
  dpo.loss = {.beta = 0.25, .loss = kernels::dpo_loss_kind::ipo, .label_smoothing = 0.125};
  auto dg = round_trip(dpo);
  EXPECT_EQ(std::tie(dg.loss.beta, dg.loss.loss, dg.loss.label_smoothing),
            std::tie(dpo.loss.beta, dpo.loss.loss, dpo.loss.label_smoothing));

  actors::train::critic_update_options co;
  co.epochs = 3;
  co.minibatches = 2;
  co.value_clip = 0.5;
  co.loss_agg = kernels::loss_agg_mode::seq_mean_token_mean;
  co.loss_scale_factor = 3;
  co.shuffle_seed = 7;
  auto cg = round_trip(co);
  EXPECT_EQ(std::tie(cg.epochs, cg.minibatches, cg.value_clip, cg.loss_agg, cg.loss_scale_factor,
                     cg.shuffle_seed),
            std::tie(co.epochs, co.minibatches, co.value_clip, co.loss_agg, co.loss_scale_factor,
                     co.shuffle_seed));
}

TEST_F(RemoteMessages, RewardRequestsCrossIntact) {
  auto b = small_batch();
  actors::rl::reward_request rr;
  rr.batch = b;
  rr.responses = {{4, 5}, {6}};
  rr.answers = {"45", "6"};
  auto rg = round_trip(rr);
  EXPECT_EQ(rg.responses, rr.responses);
  EXPECT_EQ(rg.answers, rr.answers);
  ASSERT_TRUE(rg.batch.get("tokens"));
  EXPECT_TRUE(torch::equal(*rg.batch.get("tokens"), *b.get("tokens")));
}
