// The paged decode kernel against the CPU reference (kernels::paged_attention
// on CPU tensors). The raw launcher runs on cudaMalloc'd copies of random CPU
// tensors, so this needs no CUDA-enabled LibTorch; it skips at run time when
// no device is present.

#include "kernels/cuda_device.hpp"
#include "kernels/paged_attention.hpp"

#include "tests/kernels/gpu_util.hpp"
#include "tests/kernels/test_util.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#if defined(TROUPE_WITH_CUDA)
#include "kernels/cuda/launchers.hpp"

#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <vector>
#endif

using namespace troupe;
using namespace troupe::kernels;
using namespace troupe::kernels::testing;

#if defined(TROUPE_WITH_CUDA)

namespace {

class paged_attention_gpu : public gpu_fixture {};

/// A random decode step: pools, shuffled block tables (int32, unused entries
/// -1), context lengths in [1, max_context].
struct decode_case {
  at::Tensor q, k_pool, v_pool, block_tables, context_lens, query_start;
};

decode_case make_decode_case(int64_t requests, int64_t heads, int64_t kv_heads, int64_t head_dim,
                             int64_t block_size, int64_t max_context, at::ScalarType type) {
  decode_case c;
  c.context_lens = torch::randint(1, max_context + 1, {requests}, torch::kLong);
  c.context_lens[0] = max_context; // one at the limit
  auto blocks = (c.context_lens + block_size - 1).div(block_size, "floor");
  const int64_t widest = blocks.max().item<int64_t>();
  const int64_t num_blocks = blocks.sum().item<int64_t>() + 5;
  auto perm = torch::randperm(num_blocks, torch::kLong);
  c.block_tables = torch::full({requests, widest + 1}, -1, torch::kInt);
  int64_t next = 0;
  for (int64_t r = 0; r < requests; ++r)
    for (int64_t j = 0; j < blocks[r].item<int64_t>(); ++j)
      c.block_tables.index_put_({r, j}, perm[next++]);
  c.k_pool = torch::randn({num_blocks, block_size, kv_heads, head_dim}).to(type);
  c.v_pool = torch::randn({num_blocks, block_size, kv_heads, head_dim}).to(type);
  c.q = torch::randn({requests, heads, head_dim}).to(type);
  c.query_start = torch::arange(requests + 1, torch::kLong);
  return c;
}

} // namespace

TEST_F(paged_attention_gpu, decode_kernel_matches_cpu_reference) {
  torch::manual_seed(17);
  struct shape {
    int64_t heads, kv_heads, head_dim, block_size, max_context;
  };
  const std::vector<shape> shapes = {{4, 2, 8, 4, 37},
                                     {8, 2, 64, 16, 300},
                                     {8, 8, 128, 16, 129},
                                     {12, 4, 80, 8, 70},
                                     {4, 1, 256, 32, 100}};
  for (auto type : {at::kFloat, at::kHalf, at::kBFloat16}) {
    for (const auto& s : shapes) {
      const int64_t R = 37;
      auto c =
          make_decode_case(R, s.heads, s.kv_heads, s.head_dim, s.block_size, s.max_context, type);
      const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
      auto ref = value_of(paged_attention(c.q, c.k_pool, c.v_pool, c.block_tables, c.context_lens,
                                          c.query_start, scale));
      device_buffer d_q{c.q}, d_k{c.k_pool}, d_v{c.v_pool}, d_bt{c.block_tables},
          d_len{c.context_lens}, d_out{static_cast<size_t>(c.q.numel() * c.q.element_size())};
      auto msg = cuda::launch_paged_decode_attention(
          d_q.ptr, d_k.ptr, d_v.ptr, float_type_of(type), d_bt.as<int32_t>(),
          c.block_tables.size(1), d_len.as<int64_t>(), R, s.heads, s.kv_heads, s.head_dim,
          s.block_size, static_cast<float>(scale), d_out.ptr, stream_);
      ASSERT_EQ(msg, "");
      ASSERT_CUDA(cudaStreamSynchronize(stream_));
      auto what = std::string{c10::toString(type)} + " H=" + std::to_string(s.heads) +
                  " kv=" + std::to_string(s.kv_heads) + " D=" + std::to_string(s.head_dim) +
                  " bs=" + std::to_string(s.block_size);
      double tol = type == at::kFloat ? 1e-4 : type == at::kHalf ? 2e-3 : 2e-2;
      expect_close(d_out.to_cpu(c.q.sizes(), type), ref, tol, what);
    }
  }
}

TEST_F(paged_attention_gpu, empty_context_gives_zeros_and_bad_shapes_are_rejected) {
  torch::manual_seed(18);
  auto c = make_decode_case(3, 4, 2, 16, 4, 9, at::kFloat);
  c.context_lens[1] = 0;
  device_buffer d_q{c.q}, d_k{c.k_pool}, d_v{c.v_pool}, d_bt{c.block_tables}, d_len{c.context_lens},
      d_out{static_cast<size_t>(c.q.numel() * 4)};
  ASSERT_EQ(cuda::launch_paged_decode_attention(d_q.ptr, d_k.ptr, d_v.ptr, cuda::float_type::f32,
                                                d_bt.as<int32_t>(), c.block_tables.size(1),
                                                d_len.as<int64_t>(), 3, 4, 2, 16, 4, 0.25f,
                                                d_out.ptr, stream_),
            "");
  ASSERT_CUDA(cudaStreamSynchronize(stream_));
  auto out = d_out.to_cpu({3, 4, 16}, at::kFloat);
  EXPECT_EQ(out[1].abs().sum().item<double>(), 0.0);
  auto msg = cuda::launch_paged_decode_attention(d_q.ptr, d_k.ptr, d_v.ptr, cuda::float_type::f32,
                                                 d_bt.as<int32_t>(), 1, d_len.as<int64_t>(), 3, 4,
                                                 2, 512, 4, 0.25f, d_out.ptr, stream_);
  EXPECT_NE(msg.find("head_dim 512"), std::string::npos) << msg;
  msg = cuda::launch_paged_decode_attention(d_q.ptr, d_k.ptr, d_v.ptr, cuda::float_type::f32,
                                            d_bt.as<int32_t>(), 1, d_len.as<int64_t>(), 3, 3, 2, 16,
                                            4, 0.25f, d_out.ptr, stream_);
  EXPECT_NE(msg.find("multiple of num_kv_heads"), std::string::npos) << msg;
}

#if defined(TROUPE_TORCH_CUDA)
TEST_F(paged_attention_gpu, public_api_dispatches_cuda_tensors) {
  torch::manual_seed(19);
  // Pure decode: the kernel.
  auto c = make_decode_case(9, 8, 2, 64, 16, 77, at::kFloat);
  auto cpu = value_of(paged_attention(c.q, c.k_pool, c.v_pool, c.block_tables, c.context_lens,
                                      c.query_start, 0.125));
  auto gpu = value_of(paged_attention(c.q.cuda(), c.k_pool.cuda(), c.v_pool.cuda(),
                                      c.block_tables.cuda(), c.context_lens, c.query_start, 0.125));
  EXPECT_TRUE(gpu.is_cuda());
  expect_close(gpu.cpu(), cpu, 1e-4, "decode");
  // A prefill chunk in the step: the ATen gather path on the device.
  auto starts = c.query_start.clone();
  starts.slice(0, 9) += 3; // the last request gets 4 new tokens
  auto q = torch::randn({12, 8, 64});
  auto lens = c.context_lens.clone();
  lens[8] = std::max<int64_t>(lens[8].item<int64_t>(), 4);
  auto cpu_mixed =
      value_of(paged_attention(q, c.k_pool, c.v_pool, c.block_tables, lens, starts, 0.125));
  auto gpu_mixed = value_of(paged_attention(q.cuda(), c.k_pool.cuda(), c.v_pool.cuda(),
                                            c.block_tables, lens, starts, 0.125));
  expect_close(gpu_mixed.cpu(), cpu_mixed, 1e-4, "mixed");
  // write_kv on the device.
  auto k_pool = c.k_pool.cuda();
  auto v_pool = c.v_pool.cuda();
  auto k = torch::randn({2, 2, 64}).cuda();
  ASSERT_TRUE(write_kv(k_pool, v_pool, k, k, torch::tensor({3, 17}, torch::kLong)));
  expect_close(k_pool.view({-1, 2, 64})[17].cpu(), k[1].cpu(), 0.0, "write_kv");
}
#endif

#else // !TROUPE_WITH_CUDA

TEST(paged_attention_gpu, skipped_without_cuda_build) {
  GTEST_SKIP() << "built without CUDA kernels";
}

#endif
