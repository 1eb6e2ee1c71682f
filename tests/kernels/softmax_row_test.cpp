// The sampler's fused softmax row (kernels/cpu/softmax_row.hpp) against
// LibTorch's log_softmax in double, and its refusals.
#include "kernels/cpu/softmax_row.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <vector>

using troupe::kernels::detail::softmax_row;
using troupe::kernels::detail::softmax_row_logprob;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> random_row(int64_t n, double spread, uint64_t seed) {
  torch::manual_seed(seed);
  auto t = (torch::randn({n}) * spread).contiguous();
  return {t.data_ptr<float>(), t.data_ptr<float>() + n};
}

// Every index's log-prob (from the written weights and from the stats), the
// normaliser and the argmax against the double-precision reference.
void expect_matches_reference(const std::vector<float>& x, float scale,
                              troupe::kernels::cpu::decode_isa isa) {
  auto n = static_cast<int64_t>(x.size());
  std::vector<float> w(x.size(), -1.0f);
  auto s = softmax_row(x.data(), n, scale, w.data(), isa);
  SCOPED_TRACE(std::string{to_string(isa)});
  auto ref_in = torch::from_blob(const_cast<float*>(x.data()), {n}, torch::kFloat32)
                  .to(torch::kFloat64);
  auto ref = torch::log_softmax(ref_in * static_cast<double>(scale), 0);
  ASSERT_EQ(s.argmax, ref_in.argmax().item<int64_t>()) << "n " << n;
  EXPECT_EQ(s.max, x[static_cast<size_t>(s.argmax)]);
  const double* lp = ref.data_ptr<double>();
  double worst = 0;
  for (int64_t v = 0; v < n; ++v) {
    double from_stats = softmax_row_logprob(s, x[static_cast<size_t>(v)], scale);
    worst = std::max(worst, std::abs(from_stats - lp[v]));
    // The weight is exp of a float argument scale·(x − max), whose rounding
    // is relative: 6e-8 of |log-prob|. Compared where the weight is normal.
    if (lp[v] > -80)
      EXPECT_NEAR(std::log(w[static_cast<size_t>(v)] / s.sum), lp[v], 1e-6 + 1e-7 * -lp[v])
        << "n " << n << " v " << v;
  }
  EXPECT_LT(worst, 1e-6) << "n " << n << " scale " << scale;
}

} // namespace

TEST(SoftmaxRow, MatchesDoubleLogSoftmaxOverLengthsAndTemperatures) {
  // Lengths around the 16-lane block, and a 32000-token vocabulary, on
  // every instruction-set path this CPU runs (NOTE [decode isa]).
  for (auto isa : troupe::kernels::cpu::supported_decode_isas())
    for (int64_t n : {1, 2, 15, 16, 17, 31, 33, 1000, 32000})
      for (float scale : {1.0f, 1.0f / 0.7f, 2.5f, 0.1f})
        expect_matches_reference(random_row(n, 4.0, static_cast<uint64_t>(n)), scale, isa);
}

TEST(SoftmaxRow, WideLogitRangesUnderflowToZeroNotGarbage) {
  // Gaps of hundreds of nats: exp underflows below 2^-126; such weights are
  // exactly 0 and the log-probs of the others stay exact.
  auto x = random_row(257, 60.0, 7);
  std::vector<float> w(x.size());
  auto s = softmax_row(x.data(), static_cast<int64_t>(x.size()), 1.0f, w.data());
  ASSERT_GE(s.argmax, 0);
  for (size_t v = 0; v < x.size(); ++v) {
    double y = static_cast<double>(x[v]) - s.max;
    if (y < -87.4)
      EXPECT_EQ(w[v], 0.0f) << v;
    else
      EXPECT_NEAR(w[v], std::exp(y), 3e-7 * std::exp(y)) << v;
  }
  for (auto isa : troupe::kernels::cpu::supported_decode_isas())
    expect_matches_reference(x, 1.0f, isa);
}

TEST(SoftmaxRow, MaskedLogitsGetZeroWeight) {
  auto x = random_row(40, 1.0, 3);
  for (size_t v = 0; v < x.size(); v += 3)
    x[v] = -kInf;
  std::vector<float> w(x.size(), -1.0f);
  auto s = softmax_row(x.data(), static_cast<int64_t>(x.size()), 1.0f, w.data());
  ASSERT_GE(s.argmax, 0);
  EXPECT_NE(s.argmax % 3, 0);
  double total = 0;
  for (size_t v = 0; v < x.size(); ++v) {
    if (v % 3 == 0)
      EXPECT_EQ(w[v], 0.0f) << v;
    else
      EXPECT_GT(w[v], 0.0f) << v;
    total += w[v];
  }
  EXPECT_NEAR(total, s.sum, 1e-9 * s.sum);
  EXPECT_EQ(softmax_row_logprob(s, -kInf, 1.0f), -std::numeric_limits<double>::infinity());
}

TEST(SoftmaxRow, TiesGoToTheLowestIndex) {
  std::vector<float> x(50, 0.25f);
  x[17] = x[33] = x[49] = 3.0f;
  auto s = softmax_row(x.data(), 50, 1.0f, nullptr);
  EXPECT_EQ(s.argmax, 17);
  EXPECT_FLOAT_EQ(s.max, 3.0f);
}

TEST(SoftmaxRow, RowsWithoutADistributionAreRefused) {
  auto nan_in_tail = random_row(35, 1.0, 1);
  nan_in_tail[34] = std::nanf(""); // past the last full 16-lane block
  auto nan_in_block = random_row(35, 1.0, 2);
  nan_in_block[5] = std::nanf("");
  auto plus_inf = random_row(35, 1.0, 3);
  plus_inf[20] = kInf;
  std::vector<float> all_masked(35, -kInf);
  for (const auto* row : {&nan_in_tail, &nan_in_block, &plus_inf, &all_masked}) {
    std::vector<float> w(row->size());
    EXPECT_EQ(softmax_row(row->data(), 35, 1.0f, w.data()).argmax, -1);
  }
}
