// NOTE [tensor-parallel decode] (models/llama.cpp): the inference engines of
// a TP group, each on its rank's part of the model and given the same
// requests, generate what one engine on the whole model does — greedy
// tokens equal and log-probs within 1e-5 at tp 2 (kv heads split) and tp 4
// (kv heads replicated), sampled tokens equal for fixed seeds — and a whole
// checkpoint loads into each rank's part (a weight sync into a TP rollout).
#include "actors/inference/engine.hpp"
#include "actors/inference/rollout.hpp"
#include "models/llama.hpp"
#include "models/tensor_parallel.hpp"
#include "runtime/collectives.hpp"
#include "runtime/shm_collectives.hpp"
#include "tests/actors/tiny_engine.hpp"
#include "tests/support/ranks.hpp"

#include <algorithm>
#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace troupe;
using namespace troupe::actors::inference;
using namespace troupe::actors::inference::testing;
using troupe::testing::on_every_rank;

namespace {

std::vector<generate_request> requests(bool sampled) {
  std::vector<generate_request> out;
  for (int i = 0; i < 6; ++i) {
    std::vector<int64_t> prompt;
    for (int t = 0; t < 3 + 2 * i; ++t)
      prompt.push_back(1 + (7 * i + 3 * t) % 45);
    out.push_back({"r" + std::to_string(i), prompt,
                   sampled ? random_sampling(10, 100 + static_cast<uint64_t>(i)) : greedy(10)});
  }
  out[1].sampling.n = 3; // forked samples share the prompt's KV on every rank
  return out;
}

// What each of `tp` ranks' engines generates for `reqs`, each on its part of
// `dense` (after loading `weights`, whole, when given).
std::vector<std::vector<request_output>>
on_tp_ranks(const models::llama_model& dense, int tp, const std::vector<generate_request>& reqs,
            const std::map<std::string, at::Tensor>* weights = nullptr,
            kernels::cpu::decode_path path = kernels::cpu::decode_path::automatic,
            std::vector<engine_metrics>* metrics = nullptr) {
  if (metrics)
    metrics->assign(static_cast<size_t>(tp), engine_metrics{});
  runtime::group_options go;
  go.name = "tp-decode";
  auto world = runtime::make_local_groups(tp, go);
  EXPECT_TRUE(world) << describe(world.error());
  if (!world)
    return {};
  return on_every_rank<std::vector<request_output>>(
      world->groups, [&](runtime::process_group& gloo) -> std::vector<request_output> {
        // The fused path sums through shared memory, as a job's TP group
        // does (NOTE [shm all-reduce]); the ATen path over gloo.
        auto g = std::move(gloo);
        const auto rank = static_cast<size_t>(g.rank());
        if (path == kernels::cpu::decode_path::fused) {
          auto shm = runtime::with_shm_collectives(std::move(g), world->stores[rank], "tp-decode");
          EXPECT_TRUE(shm) << describe(shm.error());
          if (!shm)
            return {};
          g = std::move(*shm);
        }
        auto part = models::partition_llama(dense->config(), g);
        EXPECT_TRUE(part) << describe(part.error());
        auto model = models::make_model_part(dense, *part);
        EXPECT_TRUE(model) << describe(model.error());
        if (!part || !model)
          return {};
        (*model)->set_decode_path(path);
        auto e = make_engine(*model);
        if (weights)
          if (auto ok = e->load_weights(1, *weights); !ok) {
            ADD_FAILURE() << describe(ok.error());
            return {};
          }
        auto outs = e->generate(reqs);
        EXPECT_TRUE(outs) << describe(outs.error());
        if (metrics)
          (*metrics)[rank] = e->metrics();
        return outs ? *outs : std::vector<request_output>{};
      });
}

void expect_tp_like(const std::vector<request_output>& want, const std::vector<request_output>& got,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t r = 0; r < want.size(); ++r) {
    ASSERT_EQ(got[r].samples.size(), want[r].samples.size()) << what;
    for (size_t s = 0; s < want[r].samples.size(); ++s) {
      const auto &a = want[r].samples[s], &b = got[r].samples[s];
      EXPECT_EQ(b.tokens, a.tokens) << what << " request " << r << " sample " << s;
      ASSERT_EQ(b.logprobs.size(), a.logprobs.size());
      for (size_t t = 0; t < a.logprobs.size(); ++t)
        EXPECT_NEAR(b.logprobs[t], a.logprobs[t], 1e-5) << what << " request " << r;
    }
  }
}

// The fused CPU decode on each rank's part (NOTE [tensor-parallel fused
// decode]) and the ATen path alike; at tp 4 the kv heads are replicated
// and every step takes the ATen path.
TEST(TensorParallelDecode, GreedyTokensEqualOneEngineAtTpTwoAndFour) {
  auto dense = tiny_model(41);
  auto want = make_engine(dense)->generate(requests(false));
  ASSERT_TRUE(want) << describe(want.error());
  using kernels::cpu::decode_path;
  for (int tp : {2, 4}) // tiny: 4 heads, 2 kv heads: split at 2, replicated at 4
    for (auto path : {decode_path::fused, decode_path::aten}) {
      auto ranks = on_tp_ranks(dense, tp, requests(false), nullptr, path);
      ASSERT_EQ(ranks.size(), static_cast<size_t>(tp));
      for (int r = 0; r < tp; ++r)
        expect_tp_like(*want, ranks[static_cast<size_t>(r)],
                       "tp " + std::to_string(tp) + " rank " + std::to_string(r) + " " +
                           std::string{to_string(path)});
    }
}

// NOTE [decode path report]: the engine counts its decode steps by path
// and says why the ATen path ran — at tp 2 (kv heads split) every decode
// step is fused; at tp 4 the replicated kv heads take ATen, and say so; on
// one rank the forced ATen path says it was asked for.
TEST(TensorParallelDecode, TheEngineReportsWhichPathEachDecodeStepTook) {
  auto dense = tiny_model(45);
  std::vector<engine_metrics> m;
  using kernels::cpu::decode_path;
  on_tp_ranks(dense, 2, requests(false), nullptr, decode_path::automatic, &m);
  ASSERT_EQ(m.size(), 2u);
  for (const auto& r : m) {
    EXPECT_GT(r.fused_decode_steps, 0);
    EXPECT_EQ(r.aten_decode_steps, 0) << r.aten_decode_reason;
  }
  on_tp_ranks(dense, 4, requests(false), nullptr, decode_path::automatic, &m);
  ASSERT_EQ(m.size(), 4u);
  for (const auto& r : m) {
    EXPECT_EQ(r.fused_decode_steps, 0);
    EXPECT_GT(r.aten_decode_steps, 0);
    EXPECT_EQ(r.aten_decode_reason, "kv heads replicated across the tensor-parallel ranks");
  }
  auto model = copy_of(dense, models::head_kind::lm);
  model->set_decode_path(decode_path::aten);
  auto e = make_engine(model);
  ASSERT_TRUE(e->generate(requests(false)));
  EXPECT_EQ(e->metrics().fused_decode_steps, 0);
  EXPECT_GT(e->metrics().aten_decode_steps, 0);
  EXPECT_EQ(e->metrics().aten_decode_reason, "the ATen path was asked for");
  const auto named = rollout_metrics(e->metrics());
  EXPECT_NE(std::find_if(named.begin(), named.end(),
                         [](const auto& kv) { return kv.first == "rollout/aten_decode_steps"; }),
            named.end());
}

TEST(TensorParallelDecode, SampledTokensEqualForFixedSeeds) {
  auto dense = tiny_model(42);
  auto want = make_engine(dense)->generate(requests(true));
  ASSERT_TRUE(want) << describe(want.error());
  auto ranks = on_tp_ranks(dense, 2, requests(true));
  ASSERT_EQ(ranks.size(), 2u);
  for (int r = 0; r < 2; ++r)
    expect_tp_like(*want, ranks[static_cast<size_t>(r)], "rank " + std::to_string(r));
}

TEST(TensorParallelDecode, AWholeCheckpointLoadsIntoEachRanksPart) {
  auto dense = tiny_model(43), other = tiny_model(44);
  const auto whole = models::export_hf_weights(other);
  auto want = make_engine(other)->generate(requests(false));
  ASSERT_TRUE(want) << describe(want.error());
  auto ranks = on_tp_ranks(dense, 2, requests(false), &whole);
  ASSERT_EQ(ranks.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    expect_tp_like(*want, ranks[static_cast<size_t>(r)], "rank " + std::to_string(r));
    ASSERT_FALSE(ranks[static_cast<size_t>(r)].empty());
    EXPECT_EQ(ranks[static_cast<size_t>(r)].front().weight_version, 1);
  }
}

// A rank's KV pool holds its own kv heads: under the same memory cap it
// has twice the blocks of the whole model's at tp 2 (kv heads split).
TEST(TensorParallelDecode, ARanksKvPoolIsSizedByItsOwnKvHeads) {
  auto dense = tiny_model(45);
  engine_config c;
  c.block_size = 4;
  c.kv_cache_mb = 0.05; // the cap binds: 64 sequences expected
  c.expected_sequences = 64;
  auto whole = engine::make(dense, c);
  ASSERT_TRUE(whole) << describe(whole.error());
  runtime::group_options go;
  go.name = "tp-pool";
  auto world = runtime::make_local_groups(2, go);
  ASSERT_TRUE(world);
  auto blocks = on_every_rank<int64_t>(world->groups, [&](runtime::process_group& g) -> int64_t {
    auto part = models::partition_llama(dense->config(), g);
    auto model = models::make_model_part(dense, *part);
    auto e = engine::make(*model, c);
    EXPECT_TRUE(e) << describe(e.error());
    return e ? (*e)->metrics().num_blocks : 0;
  });
  for (auto b : blocks)
    EXPECT_EQ(b, 2 * (*whole)->metrics().num_blocks);
}

} // namespace
