#include "actors/inference/sampler.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>

using namespace troupe;
using namespace troupe::actors::inference;

namespace {

std::vector<sampled_token> sample_run(const torch::Tensor& logits, const sampling_params& p,
                                      rng_stream& s) {
  auto r = sample(logits, {&p}, {&s});
  EXPECT_TRUE(r) << describe(r.error());
  return *r;
}

/// Frequencies of `draws` samples from one row.
std::map<int64_t, double> frequencies(const torch::Tensor& row, const sampling_params& p,
                                      int draws, uint64_t seed) {
  auto s = rng_stream::make(seed, 0);
  std::map<int64_t, double> f;
  for (int i = 0; i < draws; ++i)
    f[sample_run(row, p, s)[0].token] += 1.0 / draws;
  return f;
}

torch::Tensor logits_of(std::vector<double> probs) {
  return torch::log(torch::tensor(probs, torch::kFloat64)).to(torch::kFloat32).unsqueeze(0);
}

} // namespace

TEST(Sampler, GreedyTakesArgmaxAndReportsUnscaledLogprob) {
  auto logits = torch::tensor({{0.5f, 2.0f, -1.0f, 2.0f}});
  sampling_params p;
  p.temperature = 0;
  auto s = rng_stream::make(1, 0);
  auto out = sample_run(logits, p, s);
  EXPECT_EQ(out[0].token, 1); // first of the tied maxima
  auto expect = torch::log_softmax(logits, -1)[0][1].item<float>();
  EXPECT_NEAR(out[0].logprob, expect, 1e-6);
}

TEST(Sampler, LogprobIsUnderTemperatureScaledDistributionBeforeTruncation) {
  torch::manual_seed(3);
  auto logits = torch::randn({3, 50});
  sampling_params p;
  p.temperature = 0.7;
  p.top_k = 5;
  p.top_p = 0.9;
  std::vector<rng_stream> streams{rng_stream::make(9, 0), rng_stream::make(9, 1),
                                  rng_stream::make(9, 2)};
  auto out = sample(logits, {&p, &p, &p}, {&streams[0], &streams[1], &streams[2]});
  ASSERT_TRUE(out);
  auto ref = torch::log_softmax(logits / 0.7, -1);
  for (int r = 0; r < 3; ++r) {
    auto tok = (*out)[r].token;
    EXPECT_NEAR((*out)[r].logprob, ref[r][tok].item<float>(), 1e-5);
    // The token is among the 5 most likely.
    auto top = std::get<1>(logits[r].topk(5));
    EXPECT_TRUE((top == tok).any().item<bool>());
  }
}

TEST(Sampler, UntruncatedFrequenciesMatchSoftmax) {
  auto f = frequencies(logits_of({0.6, 0.3, 0.1}), sampling_params{}, 20000, 42);
  EXPECT_NEAR(f[0], 0.6, 0.015);
  EXPECT_NEAR(f[1], 0.3, 0.015);
  EXPECT_NEAR(f[2], 0.1, 0.015);
}

TEST(Sampler, TopKKeepsTheKMostLikelyRenormalised) {
  sampling_params p;
  p.top_k = 2;
  auto f = frequencies(logits_of({0.1, 0.5, 0.3, 0.1}), p, 20000, 7);
  EXPECT_EQ(f.size(), 2u);
  EXPECT_NEAR(f[1], 0.625, 0.015);
  EXPECT_NEAR(f[2], 0.375, 0.015);
}

TEST(Sampler, TopPKeepsSmallestSetReachingTheMass) {
  sampling_params p;
  p.top_p = 0.7; // 0.5 < 0.7 <= 0.5 + 0.3: keep the first two
  auto f = frequencies(logits_of({0.5, 0.3, 0.15, 0.05}), p, 20000, 11);
  EXPECT_EQ(f.size(), 2u);
  EXPECT_NEAR(f[0], 0.625, 0.015);
  EXPECT_NEAR(f[1], 0.375, 0.015);
}

TEST(Sampler, TemperatureSharpensAndFlattens) {
  sampling_params cold;
  cold.temperature = 0.25; // p^4 renormalised: 0.6^4 / (0.6^4 + 0.3^4 + 0.1^4) = 0.9402
  auto f = frequencies(logits_of({0.6, 0.3, 0.1}), cold, 20000, 5);
  EXPECT_NEAR(f[0], 0.9402, 0.01);
}

TEST(Sampler, RowsAreIndependentOfTheirBatch) {
  torch::manual_seed(0);
  auto logits = torch::randn({6, 100});
  sampling_params p;
  p.temperature = 1.3;
  p.top_p = 0.95;
  // Row 2 alone ...
  auto alone_stream = rng_stream::make(77, 3);
  std::vector<int64_t> alone;
  for (int i = 0; i < 20; ++i)
    alone.push_back(sample_run(logits.narrow(0, 2, 1), p, alone_stream)[0].token);
  // ... and inside a batch of 6 with other streams: the same tokens.
  std::vector<rng_stream> streams;
  for (int r = 0; r < 6; ++r)
    streams.push_back(rng_stream::make(r == 2 ? 77 : 1000 + r, r == 2 ? 3 : 0));
  std::vector<const sampling_params*> ps(6, &p);
  std::vector<rng_stream*> ss;
  for (auto& s : streams)
    ss.push_back(&s);
  for (int i = 0; i < 20; ++i) {
    auto out = sample(logits, ps, ss);
    ASSERT_TRUE(out);
    EXPECT_EQ((*out)[2].token, alone[static_cast<size_t>(i)]) << "draw " << i;
  }
}

TEST(Sampler, StreamsDifferBySeedAndIndexAndStayInUnitInterval) {
  auto a = rng_stream::make(1, 0);
  auto b = rng_stream::make(1, 1);
  auto c = rng_stream::make(2, 0);
  auto a2 = rng_stream::make(1, 0);
  int same_ab = 0, same_ac = 0;
  for (int i = 0; i < 1000; ++i) {
    double x = a.uniform(), y = b.uniform(), z = c.uniform();
    EXPECT_EQ(x, a2.uniform());
    EXPECT_GE(x, 0.0);
    EXPECT_LT(x, 1.0);
    same_ab += x == y;
    same_ac += x == z;
  }
  EXPECT_EQ(same_ab, 0);
  EXPECT_EQ(same_ac, 0);
}

TEST(Sampler, ValidationNamesEveryBadField) {
  sampling_params p;
  p.temperature = -1;
  p.top_p = 1.5;
  p.max_tokens = 0;
  p.stop_token_ids = {3, 99};
  auto r = validate(p, 50);
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::invalid_argument);
  auto msg = describe(r.error());
  EXPECT_NE(msg.find("sampling.temperature: expected a number >= 0, got -1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sampling.top_p: expected a number in (0, 1], got 1.5"), std::string::npos);
  EXPECT_NE(msg.find("sampling.max_tokens: expected an integer >= 1, got 0"), std::string::npos);
  EXPECT_NE(msg.find("sampling.stop_token_ids[1]: token 99 outside the vocabulary [0, 50)"),
            std::string::npos);
  EXPECT_TRUE(validate(sampling_params{}, 50));
}

TEST(Sampler, RejectsMismatchedInputs) {
  sampling_params p;
  auto s = rng_stream::make(0, 0);
  EXPECT_FALSE(sample(torch::zeros({2, 4}), {&p}, {&s}));
  EXPECT_FALSE(sample(torch::zeros({1, 4}, torch::kFloat64), {&p}, {&s}));
  auto shared = sample(torch::zeros({2, 4}), {&p, &p}, {&s, &s});
  ASSERT_FALSE(shared);
  EXPECT_NE(describe(shared.error()).find("its own random stream"), std::string::npos);
  auto nan = torch::full({1, 4}, std::nanf(""));
  auto r = sample(nan, {&p}, {&s});
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("no finite logit"), std::string::npos);
}
