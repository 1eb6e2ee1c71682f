// The tensor-parallel Llama (NOTE [tensor parallelism]) against the dense
// model it was cut from, over real gloo ranks in this process (one thread a
// rank): each rank's part of the logits, the vocab-parallel loss and every
// parameter's gradient within 1e-5 of the dense model's, for key / value
// heads split, replicated as a range and replicated unevenly, a vocabulary
// split unevenly, tied embeddings, biases, and the value head.
#include "models/tensor_parallel.hpp"

#include "kernels/logprobs.hpp"
#include "models/llama.hpp"
#include "runtime/collectives.hpp"
#include "tests/models/tiny_llama.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace troupe;
using namespace troupe::models;
using troupe::testing::on_every_rank;

namespace {

struct batch {
  torch::Tensor ids, mask, a, b;
};

batch make_batch(const llama_config& c) {
  torch::manual_seed(11);
  batch x;
  x.ids = torch::randint(c.vocab_size, {2, 7}, torch::kLong);
  x.mask = torch::ones({2, 7}, torch::kLong);
  x.mask.index_put_({1, torch::indexing::Slice(0, 2)}, 0); // left padding
  x.a = torch::randn({2, 6});
  x.b = torch::randn({2, 6});
  return x;
}

// Σ mask · (a · log p(next token) + b · H) from the logits of the model
// (this rank's part of them under TP, with `group`).
torch::Tensor lm_loss(const torch::Tensor& logits, const batch& x, const tp_partition& tp,
                      int64_t vocab) {
  auto shifted = logits.narrow(1, 0, 6);
  auto next = x.ids.narrow(1, 1, 6);
  auto r = tp.active() ? kernels::vocab_parallel_log_probs_and_entropy(shifted, next, tp.vocab0,
                                                                       vocab, *tp.group)
                       : kernels::token_log_probs_and_entropy(shifted, next);
  EXPECT_TRUE(r) << describe(r.error());
  auto m = x.mask.narrow(1, 1, 6).to(torch::kFloat);
  return ((x.a * r->log_probs + x.b * r->entropy) * m).sum();
}

torch::Tensor value_loss(const torch::Tensor& values, const batch& x) {
  return (values * x.a.narrow(1, 0, 1) * x.mask.to(torch::kFloat)).sum();
}

struct pass {
  torch::Tensor out; // logits (gathered under TP) or values
  torch::Tensor loss;
  std::map<std::string, torch::Tensor> grads;
};

pass run(llama_model& m, const batch& x, head_kind head) {
  pass p;
  auto out = m->forward(x.ids, x.mask);
  const auto& tp = m->tp();
  p.loss = head == head_kind::lm ? lm_loss(out, x, tp, m->config().vocab_size) : value_loss(out, x);
  p.loss.backward();
  p.out = head == head_kind::lm ? tp_gather_last(out.detach(), m->config().vocab_size, tp)
                                : out.detach();
  for (auto& [name, t] : m->named_weights())
    p.grads[name] = t.grad().defined() ? t.grad().clone() : torch::zeros_like(t);
  return p;
}

void check(const llama_config& c, int world, head_kind head = head_kind::lm) {
  torch::manual_seed(5);
  auto dense = make_llama(c, head);
  ASSERT_TRUE(dense) << describe(dense.error());
  {
    torch::NoGradGuard no_grad;
    for (auto& p : (*dense)->parameters())
      if (p.dim() == 2)
        p.mul_(5); // std 0.1: attention far from uniform
  }
  auto x = make_batch(c);
  auto want = run(*dense, x, head);

  runtime::group_options go;
  go.name = "tp";
  auto ranks = runtime::make_local_groups(world, go);
  ASSERT_TRUE(ranks) << describe(ranks.error());
  auto got = on_every_rank<std::optional<pass>>(
      ranks->groups, [&](runtime::process_group& g) -> std::optional<pass> {
        auto part = partition_llama(c, g);
        EXPECT_TRUE(part) << describe(part.error());
        auto m = part ? make_model_part(*dense, *part) : expected<llama_model>{part.error()};
        EXPECT_TRUE(m) << describe(m.error());
        return m ? std::optional<pass>{run(*m, x, head)} : std::nullopt;
      });
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(world));
    ASSERT_TRUE(got[static_cast<size_t>(r)].has_value());
    const auto& p = *got[static_cast<size_t>(r)];
    EXPECT_LT((p.out - want.out).abs().max().item<float>(), 1e-5);
    EXPECT_NEAR(p.loss.item<float>(), want.loss.item<float>(), 1e-4);
    auto part = partition_llama(c, r, world);
    ASSERT_TRUE(part);
    for (const auto& [name, grad] : p.grads) {
      auto s = tp_slice_of(name, c, *part);
      auto w = s.replicated() ? want.grads.at(name)
                              : want.grads.at(name).narrow(s.dim, s.begin, s.end - s.begin);
      ASSERT_EQ(grad.sizes(), w.sizes()) << name;
      EXPECT_LT((grad - w).abs().max().item<float>(), 1e-5) << name;
    }
  }
}

TEST(TensorParallel, PartitionsRefuseWhatDoesNotDivide) {
  auto c = models::testing::tiny_config(); // 4 heads, 2 kv heads, intermediate 48
  auto three = partition_llama(c, 0, 3);
  ASSERT_FALSE(three);
  EXPECT_NE(describe(three.error()).find("tp 3 does not divide the attention heads (4)"),
            std::string::npos);
  c.intermediate_size = 50;
  EXPECT_FALSE(partition_llama(c, 0, 4));
  c.intermediate_size = 48;
  auto four = partition_llama(c, 3, 4);
  ASSERT_TRUE(four);
  EXPECT_FALSE(four->kv_split);
  EXPECT_EQ(four->heads, 1);
  EXPECT_EQ(four->kv_heads, 2);
  EXPECT_EQ(four->vocab0, 45); // 61 ids over 4: 15, 15, 15, 16
  EXPECT_EQ(four->vocab, 16);
  EXPECT_EQ(tp_range(61, 0, 4).second, 15);
}

TEST(TensorParallel, SlicesNameEachParameter) {
  auto c = models::testing::tiny_config();
  auto p = partition_llama(c, 1, 2);
  ASSERT_TRUE(p);
  auto s = [&](const std::string& n) { return tp_slice_of(n, c, *p); };
  EXPECT_EQ(s("layers.0.attention.wq.weight").dim, 0);
  EXPECT_EQ(s("layers.0.attention.wq.weight").begin, 16); // heads 2, 3 of 8 dims
  EXPECT_EQ(s("layers.1.attention.wk.weight").begin, 8);  // kv head 1
  EXPECT_EQ(s("layers.0.attention.wo.weight").dim, 1);
  EXPECT_TRUE(s("layers.0.attention.wo.bias").replicated());
  EXPECT_EQ(s("layers.0.feed_forward.w2.weight").dim, 1);
  EXPECT_EQ(s("layers.0.feed_forward.w3.bias").begin, 24);
  EXPECT_TRUE(s("layers.0.ffn_norm.weight").replicated());
  EXPECT_EQ(s("tok_embeddings.weight").begin, 30);
  EXPECT_TRUE(s("value_head.weight").replicated());
}

TEST(TensorParallel, TwoRanksWithKvHeadsSplitMatchTheDenseModel) {
  check(models::testing::tiny_config(), 2);
}

TEST(TensorParallel, KvHeadsReplicatedAsARangeMatchTheDenseModel) {
  auto c = models::testing::tiny_config();
  c.num_key_value_heads = 1; // tiny_job's shape: one kv head, tp 2
  check(c, 2);
  c.num_key_value_heads = 2; // tp 4: one query head a rank, one kv head each
  check(c, 4);
}

TEST(TensorParallel, KvHeadsReplicatedUnevenlyMatchTheDenseModel) {
  auto c = models::testing::tiny_config();
  c.hidden_size = 48;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 3; // tp 2: rank 0 reads kv 0, 0, 1; rank 1 reads 1, 2, 2
  check(c, 2);
}

TEST(TensorParallel, ThreeRanksTiedEmbeddingsAndBiasesMatchTheDenseModel) {
  auto c = models::testing::tiny_config();
  c.hidden_size = 48;
  c.num_attention_heads = 6;
  c.num_key_value_heads = 3;
  c.tie_word_embeddings = true;
  c.qkv_bias = c.o_bias = c.mlp_bias = true;
  check(c, 3);
}

TEST(TensorParallel, TheValueHeadStaysReplicated) {
  check(models::testing::tiny_config(), 2, head_kind::value);
}

TEST(TensorParallel, GatheredWeightsEqualTheDenseOnes) {
  auto c = models::testing::tiny_config();
  torch::manual_seed(9);
  auto dense = make_llama(c, head_kind::lm);
  ASSERT_TRUE(dense);
  auto full = (*dense)->named_weights();
  runtime::group_options go;
  go.name = "tp-gather";
  auto ranks = runtime::make_local_groups(2, go);
  ASSERT_TRUE(ranks);
  auto got = on_every_rank<int>(ranks->groups, [&](runtime::process_group& g) {
    auto part = partition_llama(c, g);
    auto shards = tp_shard_weights(full, c, *part);
    int equal = 0;
    for (const auto& [name, t] : *shards) {
      auto whole = tp_gather_weight(t.contiguous(), name, c, *part);
      EXPECT_TRUE(whole) << name;
      equal += whole && torch::equal(*whole, full.at(name)) ? 1 : 0;
    }
    return equal;
  });
  for (int n : got)
    EXPECT_EQ(n, static_cast<int>(full.size()));
}

} // namespace
