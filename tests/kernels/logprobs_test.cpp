#include "kernels/logprobs.hpp"

#include "tests/kernels/test_util.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

using namespace troupe;
using namespace troupe::kernels;
using namespace troupe::kernels::testing;

namespace {

const double ln2 = std::log(2.0);
const double inf = std::numeric_limits<double>::infinity();

// logits [1, 2, 3] whose softmax is [0.5, 0.25, 0.25] (shifted by +7 to
// exercise the max subtraction): log p = [−ln 2, −2 ln 2, −2 ln 2], H = 1.5 ln 2.
at::Tensor half_quarter_quarter() {
  return (vec({0.5, 0.25, 0.25}).log() + 7.0).reshape({1, 1, 3});
}

} // namespace

TEST(token_log_probs, hand_computed_values_for_every_chunk_size) {
  auto logits = half_quarter_quarter().expand({2, 2, 3}).contiguous();
  auto tokens = torch::tensor({0, 1, 2, 0}, torch::kLong).reshape({2, 2});
  for (int64_t chunk : {1, 2, 3, 4096}) {
    auto lp = value_of(token_log_probs(logits, tokens, {.chunk_size = chunk}));
    EXPECT_EQ(lp.sizes(), (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(lp.scalar_type(), torch::kFloat);
    expect_close(lp, {-ln2, -2 * ln2, -2 * ln2, -ln2}, 1e-6, "chunk " + std::to_string(chunk));
    auto h = value_of(entropy_from_logits(logits, {.chunk_size = chunk}));
    expect_close(h, {1.5 * ln2, 1.5 * ln2, 1.5 * ln2, 1.5 * ln2}, 1e-6);
  }
}

TEST(token_log_probs, temperature_divides_the_logits) {
  // 2·log([0.5, 0.25, 0.25]) at τ = 2 is the distribution above.
  auto logits = 2.0 * vec({0.5, 0.25, 0.25}).log().reshape({1, 1, 3});
  auto tokens = torch::tensor({{1}}, torch::kLong).reshape({1, 1});
  auto both =
      value_of(token_log_probs_and_entropy(logits, tokens, {.chunk_size = 2, .temperature = 2.0}));
  expect_close(both.log_probs, {-2 * ln2}, 1e-6);
  expect_close(both.entropy, {1.5 * ln2}, 1e-6);
  expect_close(value_of(token_log_probs_full(logits, tokens, 2.0)), {-2 * ln2}, 1e-6);
  expect_close(value_of(entropy_full(logits, 2.0)), {1.5 * ln2}, 1e-6);
}

TEST(token_log_probs, minus_infinity_logits_are_zero_probability) {
  // [0, −inf, 0]: p = [½, 0, ½]; with chunk 1 one chunk is entirely −inf.
  auto logits = vec({0.0, -inf, 0.0}).reshape({1, 1, 3});
  auto tokens = torch::tensor({2}, torch::kLong).reshape({1, 1});
  for (int64_t chunk : {1, 2, 3}) {
    auto both = value_of(token_log_probs_and_entropy(logits, tokens, {.chunk_size = chunk}));
    expect_close(both.log_probs, {-ln2}, 1e-6);
    expect_close(both.entropy, {ln2}, 1e-6);
  }
  auto masked = torch::tensor({1}, torch::kLong).reshape({1, 1});
  auto lp = value_of(token_log_probs(logits, masked, {.chunk_size = 2}));
  EXPECT_TRUE(std::isinf(scalar(lp)) && scalar(lp) < 0);
}

TEST(token_log_probs, chunked_equals_full_log_softmax_gather) {
  for (int seed = 0; seed < 20; ++seed) {
    torch::manual_seed(seed);
    auto logits = 3.0 * torch::randn({3, 5, 37});
    auto tokens = torch::randint(0, 37, {3, 5}, torch::kLong);
    auto full = value_of(token_log_probs_full(logits, tokens));
    auto full_h = value_of(entropy_full(logits));
    // fp64 reference of the same fp32 logits (log-probs reach −15: fp32 ulp ~1e-6).
    auto exact = value_of(token_log_probs_full(logits.to(torch::kDouble), tokens));
    auto exact_h = value_of(entropy_full(logits.to(torch::kDouble)));
    for (int64_t chunk : {1, 5, 7, 16, 36, 37, 4096}) {
      auto what = "seed " + std::to_string(seed) + ", chunk " + std::to_string(chunk);
      auto both = value_of(token_log_probs_and_entropy(logits, tokens, {.chunk_size = chunk}));
      expect_close(both.log_probs, full, 1e-6, "log-probs vs full, " + what);
      expect_close(both.log_probs, exact, 3e-6, "log-probs vs fp64, " + what);
      expect_close(both.entropy, exact_h, 1e-6, "entropy vs fp64, " + what);
      // The full baseline (lse − Σ p·x in fp32) is the less accurate of the two.
      expect_close(both.entropy, full_h, 5e-6, "entropy vs full, " + what);
      expect_close(value_of(token_log_probs(logits, tokens, {.chunk_size = chunk})), both.log_probs,
                   0, what);
      expect_close(value_of(entropy_from_logits(logits, {.chunk_size = chunk})), both.entropy, 0,
                   what);
    }
  }
}

TEST(token_log_probs, many_rows_run_in_parallel_tiles) {
  torch::manual_seed(1);
  auto logits = torch::randn({8, 300, 211});
  auto tokens = torch::randint(0, 211, {8, 300}, torch::kLong);
  auto both = value_of(token_log_probs_and_entropy(logits, tokens, {.chunk_size = 64}));
  expect_close(both.log_probs, value_of(token_log_probs_full(logits, tokens)), 1e-5);
  expect_close(both.entropy, value_of(entropy_full(logits)), 1e-5);
}

TEST(token_log_probs, double_logits_compute_in_double) {
  torch::manual_seed(1);
  auto logits = torch::randn({2, 4, 50}, torch::kDouble);
  auto tokens = torch::randint(0, 50, {2, 4}, torch::kLong);
  auto lp = value_of(token_log_probs(logits, tokens, {.chunk_size = 9}));
  EXPECT_EQ(lp.scalar_type(), torch::kDouble);
  expect_close(lp, value_of(token_log_probs_full(logits, tokens)), 1e-12);
}

TEST(token_log_probs, half_precision_logits_compute_in_fp32) {
  torch::manual_seed(1);
  for (auto type : {torch::kBFloat16, torch::kHalf}) {
    auto logits = torch::randn({2, 3, 40}).to(type);
    auto tokens = torch::randint(0, 40, {2, 3}, torch::kInt);
    auto both = value_of(token_log_probs_and_entropy(logits, tokens, {.chunk_size = 16}));
    EXPECT_EQ(both.log_probs.scalar_type(), torch::kFloat);
    auto ref = torch::log_softmax(logits.to(torch::kFloat), -1)
                   .gather(-1, tokens.to(torch::kLong).unsqueeze(-1))
                   .squeeze(-1);
    expect_close(both.log_probs, ref, 1e-6);
    expect_close(both.entropy, value_of(entropy_full(logits.to(torch::kFloat))), 1e-6);
  }
}

TEST(token_log_probs, shifted_non_contiguous_logits) {
  torch::manual_seed(1);
  // The causal-LM call: logits[:, :-1] score tokens[:, 1:].
  auto logits = torch::randn({2, 6, 30});
  auto ids = torch::randint(0, 30, {2, 6}, torch::kLong);
  auto shifted = logits.slice(1, 0, 5);
  auto next = ids.slice(1, 1, 6);
  auto lp = value_of(token_log_probs(shifted, next, {.chunk_size = 8}));
  expect_close(lp, value_of(token_log_probs_full(shifted, next)), 1e-6);
  auto transposed = torch::randn({30, 4, 3}).permute({1, 2, 0}); // last dim strided
  auto tok = torch::randint(0, 30, {4, 3}, torch::kLong);
  expect_close(value_of(token_log_probs(transposed, tok, {.chunk_size = 7})),
               value_of(token_log_probs_full(transposed, tok)), 1e-6);
}

TEST(token_log_probs, empty_batch_gives_empty_result) {
  auto lp = value_of(token_log_probs(torch::randn({0, 5, 7}), torch::zeros({0, 5}, torch::kLong)));
  EXPECT_EQ(lp.sizes(), (std::vector<int64_t>{0, 5}));
}

TEST(token_log_probs, gradient_matches_full_version) {
  torch::manual_seed(1);
  auto base = torch::randn({2, 3, 23}, torch::kDouble);
  auto tokens = torch::randint(0, 23, {2, 3}, torch::kLong);
  auto w_lp = torch::randn({2, 3}, torch::kDouble);
  auto w_h = torch::randn({2, 3}, torch::kDouble);
  for (double temperature : {1.0, 0.7}) {
    auto a = base.clone().requires_grad_(true);
    auto both = value_of(
        token_log_probs_and_entropy(a, tokens, {.chunk_size = 5, .temperature = temperature}));
    ((both.log_probs * w_lp).sum() + (both.entropy * w_h).sum()).backward();
    auto b = base.clone().requires_grad_(true);
    auto lp = value_of(token_log_probs_full(b, tokens, temperature));
    auto h = value_of(entropy_full(b, temperature));
    ((lp * w_lp).sum() + (h * w_h).sum()).backward();
    expect_close(a.grad(), b.grad(), 1e-10, "temperature " + std::to_string(temperature));
  }
  // Only one output used: the other's gradient is skipped.
  auto c = base.clone().requires_grad_(true);
  value_of(token_log_probs(c, tokens, {.chunk_size = 4})).sum().backward();
  auto d = base.clone().requires_grad_(true);
  value_of(token_log_probs_full(d, tokens)).sum().backward();
  expect_close(c.grad(), d.grad(), 1e-10);
  auto e = base.clone().requires_grad_(true);
  value_of(entropy_from_logits(e, {.chunk_size = 6})).sum().backward();
  auto f = base.clone().requires_grad_(true);
  value_of(entropy_full(f)).sum().backward();
  expect_close(e.grad(), f.grad(), 1e-10);
}

TEST(token_log_probs, gradient_in_logits_dtype) {
  torch::manual_seed(1);
  auto a = torch::randn({2, 2, 9}).to(torch::kBFloat16).requires_grad_(true);
  auto tokens = torch::randint(0, 9, {2, 2}, torch::kLong);
  value_of(token_log_probs(a, tokens, {.chunk_size = 4})).sum().backward();
  EXPECT_EQ(a.grad().scalar_type(), torch::kBFloat16);
  // Each row's gradient is onehot − p: sums to 0.
  expect_close(a.grad().to(torch::kFloat).sum(-1), torch::zeros({2, 2}), 2e-2);
}

TEST(exact_kl_from_logits, hand_computed_value) {
  // p = [½, ½], q = [¼, ¾]: KL = ½ ln 2 + ½ ln(2/3).
  auto p = vec({0.5, 0.5}).log().reshape({1, 1, 2});
  auto q = vec({0.25, 0.75}).log().reshape({1, 1, 2}) + 3.0;
  for (int64_t chunk : {1, 2}) {
    auto kl = value_of(exact_kl_from_logits(p, q, {.chunk_size = chunk}));
    expect_close(kl, {0.5 * ln2 + 0.5 * std::log(2.0 / 3.0)}, 1e-6);
  }
  // q gives zero mass where p has none: that entry contributes 0, not NaN.
  auto p0 = vec({0.0, -inf, 0.0}).reshape({1, 1, 3});
  auto q0 = vec({0.0, -inf, std::log(3.0)}).reshape({1, 1, 3});
  auto kl0 = value_of(exact_kl_from_logits(p0, q0, {.chunk_size = 1}));
  expect_close(kl0, {0.5 * std::log(0.5 / 0.25) + 0.5 * std::log(0.5 / 0.75)}, 1e-6);
}

TEST(exact_kl_from_logits, equals_manual_sum_and_is_non_negative) {
  torch::manual_seed(2);
  auto p = 2.0 * torch::randn({3, 4, 41});
  auto q = 2.0 * torch::randn({3, 4, 41});
  auto lp = torch::log_softmax(p, -1);
  auto lq = torch::log_softmax(q, -1);
  auto manual = (lp.exp() * (lp - lq)).sum(-1);
  for (int64_t chunk : {3, 8, 41, 4096}) {
    auto kl = value_of(exact_kl_from_logits(p, q, {.chunk_size = chunk}));
    expect_close(kl, manual, 1e-5, "chunk " + std::to_string(chunk));
    EXPECT_TRUE(kl.ge(0).all().item<bool>());
  }
  expect_close(value_of(exact_kl_from_logits(p, p, {.chunk_size = 7})), torch::zeros({3, 4}), 1e-6);
  auto tempered = value_of(exact_kl_from_logits(p, q, {.chunk_size = 7, .temperature = 1.5}));
  auto tp = torch::log_softmax(p / 1.5, -1);
  auto tq = torch::log_softmax(q / 1.5, -1);
  expect_close(tempered, (tp.exp() * (tp - tq)).sum(-1), 1e-5);
}

TEST(exact_kl_from_logits, gradient_matches_autograd_of_manual_sum) {
  torch::manual_seed(2);
  auto p0 = torch::randn({2, 3, 17}, torch::kDouble);
  auto q0 = torch::randn({2, 3, 17}, torch::kDouble);
  auto w = torch::randn({2, 3}, torch::kDouble);
  auto p = p0.clone().requires_grad_(true);
  auto q = q0.clone().requires_grad_(true);
  (value_of(exact_kl_from_logits(p, q, {.chunk_size = 5, .temperature = 1.3})) * w)
      .sum()
      .backward();
  auto p2 = p0.clone().requires_grad_(true);
  auto q2 = q0.clone().requires_grad_(true);
  auto lp = torch::log_softmax(p2 / 1.3, -1);
  auto lq = torch::log_softmax(q2 / 1.3, -1);
  ((lp.exp() * (lp - lq)).sum(-1) * w).sum().backward();
  expect_close(p.grad(), p2.grad(), 1e-10, "d/dlogits");
  expect_close(q.grad(), q2.grad(), 1e-10, "d/dref_logits");
}

TEST(token_log_probs, rejects_bad_arguments) {
  auto logits = torch::randn({2, 4, 10});
  auto tokens = torch::zeros({2, 4}, torch::kLong);
  expect_error(token_log_probs(logits, torch::zeros({2, 3}, torch::kLong)), errc::shape_mismatch,
               "token_log_probs: tokens has shape [2, 3], expected [2, 4]");
  expect_error(token_log_probs(logits, torch::zeros({2, 4})), errc::shape_mismatch,
               "tokens has dtype Float");
  expect_error(token_log_probs(torch::zeros({2, 4, 10}, torch::kLong), tokens),
               errc::shape_mismatch, "logits has dtype Long");
  expect_error(token_log_probs(torch::randn({10}), torch::zeros({}, torch::kLong)),
               errc::shape_mismatch, "at least 2 dimensions");
  expect_error(token_log_probs(logits, torch::full({2, 4}, 10, torch::kLong)), errc::out_of_range,
               "expected ids in [0, 10)");
  expect_error(token_log_probs(logits, torch::full({2, 4}, -1, torch::kLong)), errc::out_of_range);
  expect_error(token_log_probs(logits, tokens, {.chunk_size = 0}), errc::invalid_argument,
               "chunk_size must be >= 1, got 0");
  expect_error(token_log_probs(logits, tokens, {.temperature = 0.0}), errc::invalid_argument,
               "temperature must be in (0, inf), got 0");
  expect_error(token_log_probs(at::Tensor{}, tokens), errc::invalid_argument,
               "logits is undefined");
  expect_error(entropy_from_logits(logits, {.temperature = -1.0}), errc::invalid_argument);
  expect_error(token_log_probs_full(logits, torch::zeros({4}, torch::kLong)), errc::shape_mismatch);
  expect_error(exact_kl_from_logits(logits, torch::randn({2, 4, 11})), errc::shape_mismatch,
               "ref_logits has shape [2, 4, 11], expected [2, 4, 10] like logits");
}
