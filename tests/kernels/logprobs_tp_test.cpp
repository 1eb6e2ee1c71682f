// The vocab-parallel log-probs and entropy (NOTE [vocab-parallel
// log-probs]) against the full-logit computation on one rank, over real
// gloo ranks in this process: values on every rank, the gradients of each
// rank's columns, with a temperature, a vocabulary split unevenly, masked
// (−inf) vocabulary entries and padded rows that the loss leaves out.
#include "kernels/logprobs.hpp"
#include "runtime/collectives.hpp"

#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace troupe;
using troupe::testing::on_every_rank;

namespace {

struct case_result {
  torch::Tensor log_probs, entropy, grad;
};

// Rank g.rank()'s columns [v0, v1) of `logits`: log-probs, entropy and the
// gradient of Σ mask · (a · log p + b · H) in its columns.
case_result on_rank(runtime::process_group& g, const torch::Tensor& logits,
                    const torch::Tensor& tokens, const torch::Tensor& a, const torch::Tensor& b,
                    const torch::Tensor& mask, double temperature) {
  const int64_t V = logits.size(-1);
  const int64_t v0 = V * g.rank() / g.size(), v1 = V * (g.rank() + 1) / g.size();
  auto part = logits.narrow(-1, v0, v1 - v0).detach().clone().requires_grad_(true);
  kernels::logits_options o;
  o.temperature = temperature;
  auto r = kernels::vocab_parallel_log_probs_and_entropy(part, tokens, v0, V, g, o);
  EXPECT_TRUE(r) << describe(r.error());
  if (!r)
    return {};
  ((a * r->log_probs + b * r->entropy) * mask).sum().backward();
  return {r->log_probs.detach(), r->entropy.detach(), part.grad()};
}

void check(int world, int64_t V, double temperature) {
  SCOPED_TRACE("tp " + std::to_string(world) + ", V " + std::to_string(V) + ", temperature " +
               std::to_string(temperature));
  torch::manual_seed(7);
  auto logits = torch::randn({3, 5, V}, torch::kFloat64) * 3;
  logits.index_put_({0, 1, torch::indexing::Slice(0, V / 2)}, -INFINITY); // masked vocabulary
  auto tokens = torch::randint(V, {3, 5}, torch::kLong);
  tokens.index_put_({0, 1}, V - 1); // a token still allowed
  auto mask = torch::ones({3, 5}, torch::kFloat64);
  mask.index_put_({2, torch::indexing::Slice(3, 5)}, 0.0); // padded rows
  tokens.index_put_({2, torch::indexing::Slice(3, 5)}, 0);
  auto a = torch::randn({3, 5}, torch::kFloat64), b = torch::randn({3, 5}, torch::kFloat64);

  auto full = logits.clone().requires_grad_(true);
  auto want_lp = kernels::token_log_probs_full(full, tokens, temperature);
  auto want_h = kernels::entropy_full(full.masked_fill(full.isinf(), -1e300), temperature);
  ASSERT_TRUE(want_lp && want_h);
  ((a * *want_lp + b * *want_h) * mask).sum().backward();

  runtime::group_options go;
  go.name = "vocab-parallel";
  auto ranks = runtime::make_local_groups(world, go);
  ASSERT_TRUE(ranks) << describe(ranks.error());
  auto got = on_every_rank<case_result>(ranks->groups, [&](runtime::process_group& g) {
    return on_rank(g, logits, tokens, a, b, mask, temperature);
  });
  for (int r = 0; r < world; ++r) {
    const auto& out = got[static_cast<size_t>(r)];
    ASSERT_TRUE(out.log_probs.defined());
    EXPECT_LT((out.log_probs - *want_lp).abs().max().item<double>(), 1e-10) << "rank " << r;
    EXPECT_LT((out.entropy - *want_h).abs().max().item<double>(), 1e-10) << "rank " << r;
    const int64_t v0 = V * r / world, v1 = V * (r + 1) / world;
    auto want_grad = full.grad().narrow(-1, v0, v1 - v0);
    EXPECT_LT((out.grad - want_grad).abs().max().item<double>(), 1e-10) << "rank " << r;
  }
}

TEST(VocabParallelLogProbs, MatchTheFullLogitsOnEveryRank) {
  check(2, 10, 1.0);
  check(2, 11, 0.7); // parts of 5 and 6
  check(3, 17, 1.3);
}

TEST(VocabParallelLogProbs, Fp32LogitsMatchWithin1e5) {
  torch::manual_seed(3);
  const int64_t V = 64;
  auto logits = torch::randn({4, 6, V});
  auto tokens = torch::randint(V, {4, 6}, torch::kLong);
  auto want = kernels::token_log_probs_and_entropy(logits, tokens);
  ASSERT_TRUE(want);
  runtime::group_options go;
  go.name = "vocab-parallel-fp32";
  auto ranks = runtime::make_local_groups(2, go);
  ASSERT_TRUE(ranks);
  auto got =
      on_every_rank<kernels::log_probs_entropy>(ranks->groups, [&](runtime::process_group& g) {
        auto part = logits.narrow(-1, g.rank() * V / 2, V / 2);
        auto r =
            kernels::vocab_parallel_log_probs_and_entropy(part, tokens, g.rank() * V / 2, V, g);
        return r ? *r : kernels::log_probs_entropy{};
      });
  for (const auto& r : got) {
    ASSERT_TRUE(r.log_probs.defined());
    EXPECT_EQ(r.log_probs.scalar_type(), torch::kFloat);
    EXPECT_LT((r.log_probs - want->log_probs).abs().max().item<float>(), 1e-5);
    EXPECT_LT((r.entropy - want->entropy).abs().max().item<float>(), 1e-5);
  }
}

// Logits far from 0 (an offset of 3000, where fp32's spacing is 2.4e-4):
// the entropy stays within 1e-4 of the fp64 one (it is computed relative
// to the row's largest logit, not as a difference of two ~3000 numbers).
TEST(VocabParallelLogProbs, LargeLogitsKeepTheEntropyPrecise) {
  torch::manual_seed(4);
  const int64_t V = 64;
  auto logits = torch::randn({3, 5, V}, torch::kFloat64) * 2 + 3000;
  auto tokens = torch::randint(V, {3, 5}, torch::kLong);
  auto want = kernels::entropy_full(logits);
  ASSERT_TRUE(want);
  runtime::group_options go;
  go.name = "vocab-parallel-large";
  auto ranks = runtime::make_local_groups(2, go);
  ASSERT_TRUE(ranks);
  auto narrow = logits.to(torch::kFloat);
  auto got = on_every_rank<torch::Tensor>(ranks->groups, [&](runtime::process_group& g) {
    auto part = narrow.narrow(-1, g.rank() * V / 2, V / 2);
    auto r = kernels::vocab_parallel_log_probs_and_entropy(part, tokens, g.rank() * V / 2, V, g);
    return r ? r->entropy : torch::Tensor{};
  });
  for (const auto& h : got) {
    ASSERT_TRUE(h.defined());
    EXPECT_LT((h.to(torch::kFloat64) - *want).abs().max().item<double>(), 1e-4);
  }
}

TEST(VocabParallelLogProbs, RefusesTokensOutsideTheVocabularyAndABadShard) {
  runtime::group_options go;
  go.name = "vocab-parallel-bad";
  auto ranks = runtime::make_local_groups(1, go);
  ASSERT_TRUE(ranks);
  auto& g = ranks->groups[0];
  auto logits = torch::randn({2, 3, 8});
  auto bad =
      kernels::vocab_parallel_log_probs_and_entropy(logits, torch::full({2, 3}, 8L), 0, 8, g);
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("expected ids in [0, 8)"), std::string::npos);
  auto outside = kernels::vocab_parallel_log_probs_and_entropy(
      logits, torch::zeros({2, 3}, torch::kLong), 4, 10, g);
  ASSERT_FALSE(outside);
  EXPECT_NE(describe(outside.error()).find("shard [4, 12)"), std::string::npos);
}

} // namespace
