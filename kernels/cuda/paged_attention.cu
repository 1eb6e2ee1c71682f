// Paged decode attention (NOTE [paged KV layout] in kernels/paged_attention.hpp):
// one thread block per (request, query head). Each warp walks a strided
// subset of the request's cache blocks, reading K/V rows through the block
// table (lanes split head_dim, so a token's row is one coalesced load), and
// keeps an online softmax (running max, Σ exp, Σ exp·v) in fp32, updated once
// per chunk of kTokens tokens so the chunk's dot products overlap. The warps'
// partial states are merged through shared memory at the end.
//
// Not done (yet): splitting one long context over several thread blocks
// ("flash decoding") for small batches, and sharing K/V loads between the
// query heads of one kv group.

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/launchers.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

namespace troupe::kernels::cuda {

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxHeadDim = 256;
constexpr int kPerLane = kMaxHeadDim / 32;
constexpr int kTokens = 8; // tokens per online-softmax update

__device__ __forceinline__ float load(const float* p) {
  return __ldg(p);
}
__device__ __forceinline__ float load(const __half* p) {
  return __half2float(__ldg(p));
}
__device__ __forceinline__ float load(const __nv_bfloat16* p) {
  return __bfloat162float(__ldg(p));
}

__device__ __forceinline__ void store(float* p, float x) {
  *p = x;
}
__device__ __forceinline__ void store(__half* p, float x) {
  *p = __float2half(x);
}
__device__ __forceinline__ void store(__nv_bfloat16* p, float x) {
  *p = __float2bfloat16(x);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    paged_decode_kernel(const T* __restrict__ q, const T* __restrict__ k_pool,
                        const T* __restrict__ v_pool, const int32_t* __restrict__ block_tables,
                        int64_t max_blocks, const int64_t* __restrict__ context_lens, int num_heads,
                        int num_kv_heads, int head_dim, int block_size, float scale,
                        T* __restrict__ out) {
  __shared__ float warp_max[kWarps];
  __shared__ float warp_sum[kWarps];
  __shared__ float warp_acc[kWarps][kMaxHeadDim];

  const int64_t r = blockIdx.x;
  const int h = blockIdx.y;
  const int kv = h / (num_heads / num_kv_heads);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int64_t len = context_lens[r];
  const int64_t n_blocks = (len + block_size - 1) / block_size;
  const int32_t* table = block_tables + r * max_blocks;
  const int64_t token_stride = static_cast<int64_t>(num_kv_heads) * head_dim;

  float qr[kPerLane];
  float acc[kPerLane];
  const T* q_row = q + (r * num_heads + h) * static_cast<int64_t>(head_dim);
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    qr[i] = d < head_dim ? load(q_row + d) * scale : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY; // running max of the scores seen by this warp
  float l = 0.0f;      // Σ exp(score − m)

  for (int64_t b = warp; b < n_blocks; b += kWarps) {
    const int64_t first_slot = static_cast<int64_t>(table[b]) * block_size;
    const int64_t left = len - b * block_size;
    const int n_tok = static_cast<int>(left < block_size ? left : block_size);
    const int64_t head_offset = static_cast<int64_t>(kv) * head_dim;
    const T* k_base = k_pool + first_slot * token_stride + head_offset;
    const T* v_base = v_pool + first_slot * token_stride + head_offset;
    for (int t0 = 0; t0 < n_tok; t0 += kTokens) {
      float s[kTokens];
#pragma unroll
      for (int j = 0; j < kTokens; ++j) {
        s[j] = 0.0f;
        if (t0 + j < n_tok) { // warp-uniform
          const T* k_tok = k_base + (t0 + j) * token_stride;
#pragma unroll
          for (int i = 0; i < kPerLane; ++i) {
            const int d = lane + 32 * i;
            if (d < head_dim)
              s[j] += qr[i] * load(k_tok + d);
          }
        }
      }
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1)
#pragma unroll
        for (int j = 0; j < kTokens; ++j)
          s[j] += __shfl_xor_sync(0xffffffffu, s[j], offset);
      float chunk_max = -INFINITY;
#pragma unroll
      for (int j = 0; j < kTokens; ++j)
        if (t0 + j < n_tok)
          chunk_max = fmaxf(chunk_max, s[j]);
      const float m_new = fmaxf(m, chunk_max);
      const float alpha = expf(m - m_new); // 0 on the first chunk (m = −inf)
      l *= alpha;
#pragma unroll
      for (int i = 0; i < kPerLane; ++i)
        acc[i] *= alpha;
#pragma unroll
      for (int j = 0; j < kTokens; ++j) {
        if (t0 + j < n_tok) {
          const float p = expf(s[j] - m_new);
          l += p;
          const T* v_tok = v_base + (t0 + j) * token_stride;
#pragma unroll
          for (int i = 0; i < kPerLane; ++i) {
            const int d = lane + 32 * i;
            if (d < head_dim)
              acc[i] += p * load(v_tok + d);
          }
        }
      }
      m = m_new;
    }
  }

  if (lane == 0) {
    warp_max[warp] = m;
    warp_sum[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < head_dim)
      warp_acc[warp][d] = acc[i];
  }
  __syncthreads();

  float global_max = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w)
    global_max = fmaxf(global_max, warp_max[w]);
  float weight[kWarps];
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    weight[w] = warp_max[w] == -INFINITY ? 0.0f : expf(warp_max[w] - global_max);
    total += weight[w] * warp_sum[w];
  }
  const float inv_total = total > 0.0f ? 1.0f / total : 0.0f;
  T* out_row = out + (r * num_heads + h) * static_cast<int64_t>(head_dim);
  for (int d = threadIdx.x; d < head_dim; d += kThreads) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      o += weight[w] * warp_acc[w][d];
    store(out_row + d, o * inv_total);
  }
}

template <class T>
std::string launch(const void* q, const void* k_pool, const void* v_pool,
                   const int32_t* block_tables, int64_t max_blocks, const int64_t* context_lens,
                   int64_t requests, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                   int64_t block_size, float scale, void* out, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(requests), static_cast<unsigned>(num_heads));
  paged_decode_kernel<T><<<grid, kThreads, 0, stream>>>(
      static_cast<const T*>(q), static_cast<const T*>(k_pool), static_cast<const T*>(v_pool),
      block_tables, max_blocks, context_lens, static_cast<int>(num_heads),
      static_cast<int>(num_kv_heads), static_cast<int>(head_dim), static_cast<int>(block_size),
      scale, static_cast<T*>(out));
  return TROUPE_CUDA_CHECK(cudaGetLastError(), "launching paged_decode_kernel");
}

} // namespace

std::string launch_paged_decode_attention(const void* q, const void* k_pool, const void* v_pool,
                                          float_type type, const int32_t* block_tables,
                                          int64_t max_blocks, const int64_t* context_lens,
                                          int64_t requests, int64_t num_heads, int64_t num_kv_heads,
                                          int64_t head_dim, int64_t block_size, float scale,
                                          void* out, cudaStream_t stream) {
  if (requests <= 0)
    return {};
  if (requests > 0x7fffffff)
    return "launch_paged_decode_attention: more than 2^31 - 1 requests";
  if (head_dim < 1 || head_dim > kMaxHeadDim)
    return "launch_paged_decode_attention: head_dim " + std::to_string(head_dim) + " outside [1, " +
           std::to_string(kMaxHeadDim) + "]";
  if (num_kv_heads < 1 || num_heads < 1 || num_heads % num_kv_heads != 0 || num_heads > 65535)
    return "launch_paged_decode_attention: num_heads " + std::to_string(num_heads) +
           " must be in [1, 65535] and a multiple of num_kv_heads " + std::to_string(num_kv_heads);
  if (block_size < 1 || block_size > 0x7fffffff)
    return "launch_paged_decode_attention: block_size must be positive";
  switch (type) {
  case float_type::f32:
    return launch<float>(q, k_pool, v_pool, block_tables, max_blocks, context_lens, requests,
                         num_heads, num_kv_heads, head_dim, block_size, scale, out, stream);
  case float_type::f16:
    return launch<__half>(q, k_pool, v_pool, block_tables, max_blocks, context_lens, requests,
                          num_heads, num_kv_heads, head_dim, block_size, scale, out, stream);
  case float_type::bf16:
    return launch<__nv_bfloat16>(q, k_pool, v_pool, block_tables, max_blocks, context_lens,
                                 requests, num_heads, num_kv_heads, head_dim, block_size, scale,
                                 out, stream);
  }
  return "launch_paged_decode_attention: unknown float_type";
}

} // namespace troupe::kernels::cuda
