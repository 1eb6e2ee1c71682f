// CUDA kernels against the CPU reference. The raw launchers run on
// cudaMalloc'd copies of random CPU tensors, so this needs no CUDA-enabled
// LibTorch; it skips at run time when no device is present.

#include "kernels/cuda_device.hpp"
#include "kernels/gae.hpp"
#include "kernels/logprobs.hpp"

#include "tests/kernels/gpu_util.hpp"
#include "tests/kernels/test_util.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#if defined(TROUPE_WITH_CUDA)
#include "kernels/cuda/launchers.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#endif

using namespace troupe;
using namespace troupe::kernels;
using namespace troupe::kernels::testing;

#if defined(TROUPE_WITH_CUDA)

namespace {

class kernels_gpu : public gpu_fixture {};

} // namespace

TEST_F(kernels_gpu, fused_logprobs_match_cpu_reference) {
  torch::manual_seed(3);
  for (auto type : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (int64_t vocab : {1, 7, 255, 32000}) {
      const int64_t rows = 37;
      auto logits = (3.0 * torch::randn({rows, vocab})).to(type);
      auto tokens = torch::randint(0, vocab, {rows}, torch::kLong);
      if (vocab > 1) { // a masked vocabulary entry
        logits.index_put_({0, 0}, -std::numeric_limits<float>::infinity());
        tokens.index_put_({0}, 1);
      }
      const double temperature = 0.8;
      auto ref = value_of(token_log_probs_and_entropy(logits.unsqueeze(0), tokens.unsqueeze(0),
                                                      {.temperature = temperature}));
      device_buffer d_logits{logits};
      device_buffer d_tokens{tokens};
      device_buffer d_lp{rows * sizeof(float)}, d_h{rows * sizeof(float)},
          d_lse{rows * sizeof(float)};
      auto msg = cuda::launch_token_logprobs(
          d_logits.ptr, float_type_of(type), rows, vocab, vocab, d_tokens.as<int64_t>(),
          static_cast<float>(1.0 / temperature), d_lp.as<float>(), d_h.as<float>(),
          d_lse.as<float>(), stream_);
      ASSERT_EQ(msg, "");
      ASSERT_CUDA(cudaStreamSynchronize(stream_));
      auto what = std::string{c10::toString(type)} + " V=" + std::to_string(vocab);
      expect_close(d_lp.to_cpu({rows}, at::kFloat), ref.log_probs.reshape({-1}), 5e-4, what);
      expect_close(d_h.to_cpu({rows}, at::kFloat), ref.entropy.reshape({-1}), 5e-4, what);
      auto lse = torch::logsumexp(logits.to(at::kFloat) / temperature, {-1});
      expect_close(d_lse.to_cpu({rows}, at::kFloat), lse, 5e-4, what);
    }
  }
}

TEST_F(kernels_gpu, fused_logprobs_out_of_range_token_is_nan_and_null_outputs_are_skipped) {
  torch::manual_seed(4);
  auto logits = torch::randn({2, 10});
  auto tokens = torch::tensor({10, -1}, torch::kLong);
  device_buffer d_logits{logits};
  device_buffer d_tokens{tokens};
  device_buffer d_lp{2 * sizeof(float)};
  ASSERT_EQ(cuda::launch_token_logprobs(d_logits.ptr, cuda::float_type::f32, 2, 10, 10,
                                        d_tokens.as<int64_t>(), 1.0f, d_lp.as<float>(), nullptr,
                                        nullptr, stream_),
            "");
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  auto lp = d_lp.to_cpu({2}, at::kFloat);
  EXPECT_TRUE(std::isnan(lp[0].item<float>()));
  EXPECT_TRUE(std::isnan(lp[1].item<float>()));
}

TEST_F(kernels_gpu, gae_matches_cpu_reference) {
  torch::manual_seed(5);
  const int64_t batch = 300, steps = 97;
  for (auto type : {at::kFloat, at::kDouble}) {
    auto rewards = torch::randn({batch, steps}, type);
    auto values = torch::randn({batch, steps}, type);
    auto mask = torch::rand({batch, steps}).gt(0.2).to(torch::kBool);
    mask.slice(1, 80, steps).zero_(); // right padding
    auto ref = value_of(gae(rewards, values, mask, 0.99, 0.95));
    auto rtg = value_of(discounted_returns(rewards, mask, 0.97));
    device_buffer d_r{rewards}, d_v{values}, d_m{mask};
    auto bytes = static_cast<size_t>(batch * steps) * rewards.element_size();
    device_buffer d_a{bytes}, d_ret{bytes};
    std::string msg;
    if (type == at::kFloat) {
      msg = cuda::launch_gae(d_r.as<float>(), d_v.as<float>(), d_m.as<uint8_t>(), batch, steps,
                             0.99f, 0.95f, d_a.as<float>(), d_ret.as<float>(), stream_);
    } else {
      msg = cuda::launch_gae(d_r.as<double>(), d_v.as<double>(), d_m.as<uint8_t>(), batch, steps,
                             0.99, 0.95, d_a.as<double>(), d_ret.as<double>(), stream_);
    }
    ASSERT_EQ(msg, "");
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    double tol = type == at::kFloat ? 1e-4 : 1e-10;
    expect_close(d_a.to_cpu({batch, steps}, type), ref.advantages, tol, "advantages");
    expect_close(d_ret.to_cpu({batch, steps}, type), ref.returns, tol, "returns");
    // values = null, λ = 1: discounted returns.
    if (type == at::kFloat) {
      msg = cuda::launch_gae(d_r.as<float>(), nullptr, d_m.as<uint8_t>(), batch, steps, 0.97f, 1.0f,
                             d_a.as<float>(), d_ret.as<float>(), stream_);
    } else {
      msg = cuda::launch_gae(d_r.as<double>(), nullptr, d_m.as<uint8_t>(), batch, steps, 0.97, 1.0,
                             d_a.as<double>(), d_ret.as<double>(), stream_);
    }
    ASSERT_EQ(msg, "");
    ASSERT_CUDA(cudaStreamSynchronize(stream_));
    expect_close(d_a.to_cpu({batch, steps}, type), rtg, tol, "discounted returns");
  }
}

TEST_F(kernels_gpu, seed_gae_table_column_on_device) {
  auto rewards = vec({0.1, 0.1, 0.2, 0.1, 0.5, 0.1, 0.3, 0.1, 0.1, 1.0}).unsqueeze(0);
  auto values = vec({0.8, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.3, 0.2, 0.1}).unsqueeze(0);
  auto mask = torch::ones({1, 10}, torch::kBool);
  device_buffer d_r{rewards}, d_v{values}, d_m{mask}, d_a{40}, d_ret{40};
  ASSERT_EQ(cuda::launch_gae(d_r.as<float>(), d_v.as<float>(), d_m.as<uint8_t>(), 1, 10, 0.99f,
                             0.95f, d_a.as<float>(), d_ret.as<float>(), stream_),
            "");
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  expect_close(d_a.to_cpu({1, 10}, at::kFloat),
               {1.1925, 1.2754, 1.2572, 1.2368, 1.3204, 0.9828, 0.9430, 0.7931, 0.8455, 0.9000},
               1e-4);
}

#if defined(TROUPE_TORCH_CUDA)
TEST_F(kernels_gpu, public_api_dispatches_cuda_tensors) {
  torch::manual_seed(6);
  auto logits = torch::randn({4, 16, 1000});
  auto tokens = torch::randint(0, 1000, {4, 16}, torch::kLong);
  auto cpu = value_of(token_log_probs_and_entropy(logits, tokens));
  auto gpu = value_of(token_log_probs_and_entropy(logits.cuda(), tokens.cuda()));
  expect_close(gpu.log_probs.cpu(), cpu.log_probs, 1e-4);
  expect_close(gpu.entropy.cpu(), cpu.entropy, 1e-4);
  auto r = torch::randn({8, 33}), v = torch::randn({8, 33});
  auto m = torch::ones({8, 33});
  auto a_cpu = value_of(gae(r, v, m, 1.0, 0.95));
  auto a_gpu = value_of(gae(r.cuda(), v.cuda(), m.cuda(), 1.0, 0.95));
  expect_close(a_gpu.advantages.cpu(), a_cpu.advantages, 1e-4);
}
#endif

#else // !TROUPE_WITH_CUDA

TEST(kernels_gpu, skipped_without_cuda_build) {
  GTEST_SKIP() << "built without CUDA kernels";
}

#endif
