// Fused token log-prob + entropy: one block per row, one pass over the
// vocabulary with an online (max, Σ exp, Σ exp·(x − max)) per thread, then a
// block reduction (NOTE [chunked logsumexp] in kernels/logprobs.cpp).

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/launchers.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cfloat>
#include <climits>

namespace troupe::kernels::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float load(const float* p) {
  return __ldg(p);
}
__device__ __forceinline__ float load(const __half* p) {
  return __half2float(__ldg(p));
}
__device__ __forceinline__ float load(const __nv_bfloat16* p) {
  return __bfloat162float(__ldg(p));
}

// Running stats relative to the max m: s = Σ exp(x − m), t = Σ exp(x − m)·(x − m).
struct stats {
  float m;
  float s;
  float t;
};

__device__ __forceinline__ stats combine(const stats& a, const stats& b) {
  const float m = fmaxf(a.m, b.m);
  const float da = a.m - m;
  const float db = b.m - m;
  const float ea = expf(da);
  const float eb = expf(db);
  return {m, ea * a.s + eb * b.s, ea * (a.t + da * a.s) + eb * (b.t + db * b.s)};
}

__device__ __forceinline__ void push(stats& st, float x) {
  x = fmaxf(x, -FLT_MAX); // −inf logits: exp(·) = 0 without 0·inf
  if (x > st.m) {
    const float d = st.m - x;
    const float a = expf(d);
    st.t = a * (st.t + d * st.s);
    st.s = a * st.s + 1.0f;
    st.m = x;
  } else {
    const float d = x - st.m;
    const float e = expf(d);
    st.s += e;
    st.t += e * d;
  }
}

__device__ __forceinline__ stats warp_reduce(stats st) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    stats other{__shfl_xor_sync(0xffffffffu, st.m, offset),
                __shfl_xor_sync(0xffffffffu, st.s, offset),
                __shfl_xor_sync(0xffffffffu, st.t, offset)};
    st = combine(st, other);
  }
  return st;
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    logprobs_kernel(const T* __restrict__ logits, int64_t rows, int64_t vocab, int64_t row_stride,
                    const int64_t* __restrict__ tokens, float inv_temperature,
                    float* __restrict__ log_probs, float* __restrict__ entropy,
                    float* __restrict__ lse) {
  __shared__ stats partial[kWarps];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* x = logits + row * row_stride;
    stats st{-FLT_MAX, 0.0f, 0.0f};
    for (int64_t v = threadIdx.x; v < vocab; v += kThreads)
      push(st, load(x + v) * inv_temperature);
    st = warp_reduce(st);
    if (lane == 0)
      partial[warp] = st;
    __syncthreads();
    if (warp == 0) {
      st = lane < kWarps ? partial[lane] : stats{-FLT_MAX, 0.0f, 0.0f};
      st = warp_reduce(st);
      if (lane == 0) {
        const float log_s = logf(st.s);
        const float row_lse = st.m + log_s;
        if (lse)
          lse[row] = row_lse;
        if (entropy)
          entropy[row] = log_s - st.t / st.s;
        if (tokens && log_probs) {
          const int64_t id = tokens[row];
          log_probs[row] = (id >= 0 && id < vocab) ? load(x + id) * inv_temperature - row_lse
                                                   : __int_as_float(0x7fc00000);
        }
      }
    }
    __syncthreads(); // partial[] is reused by the next row
  }
}

template <class T>
std::string launch(const void* logits, int64_t rows, int64_t vocab, int64_t row_stride,
                   const int64_t* tokens, float inv_temperature, float* log_probs, float* entropy,
                   float* lse, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(rows < INT_MAX ? rows : INT_MAX);
  logprobs_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(logits), rows, vocab,
                                                      row_stride, tokens, inv_temperature,
                                                      log_probs, entropy, lse);
  return TROUPE_CUDA_CHECK(cudaGetLastError(), "launching logprobs_kernel");
}

} // namespace

std::string launch_token_logprobs(const void* logits, float_type type, int64_t rows, int64_t vocab,
                                  int64_t row_stride, const int64_t* tokens, float inv_temperature,
                                  float* log_probs, float* entropy, float* lse,
                                  cudaStream_t stream) {
  if (rows <= 0)
    return {};
  if (vocab <= 0)
    return "launch_token_logprobs: vocab must be positive";
  switch (type) {
  case float_type::f32:
    return launch<float>(logits, rows, vocab, row_stride, tokens, inv_temperature, log_probs,
                         entropy, lse, stream);
  case float_type::f16:
    return launch<__half>(logits, rows, vocab, row_stride, tokens, inv_temperature, log_probs,
                          entropy, lse, stream);
  case float_type::bf16:
    return launch<__nv_bfloat16>(logits, rows, vocab, row_stride, tokens, inv_temperature,
                                 log_probs, entropy, lse, stream);
  }
  return "launch_token_logprobs: unknown float_type";
}

} // namespace troupe::kernels::cuda
