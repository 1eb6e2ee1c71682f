#pragma once
// Raw-pointer launchers of troupe's CUDA kernels (no LibTorch here, so they
// build and test against any LibTorch, or none). Every launcher enqueues on
// the given stream and returns "" on success or a message from
// TROUPE_CUDA_CHECK ("<file>:<line>: <what>: <cuda error>"); it does not
// synchronise. All pointers are device pointers.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

namespace troupe::kernels::cuda {

/// Element type of the logits.
enum class float_type { f32, f16, bf16 };

/// One pass over each row of logits [rows, vocab] (row r starts at r·row_stride
/// elements, entries contiguous), scaled by inv_temperature, in fp32:
/// lse[r] = logsumexp, log_probs[r] = x[tokens[r]] − lse (NaN for an id outside
/// [0, vocab)), entropy[r] = −Σ p log p. tokens / log_probs, entropy and lse may
/// each be null (not computed / not written).
std::string launch_token_logprobs(const void* logits, float_type type, int64_t rows, int64_t vocab,
                                  int64_t row_stride, const int64_t* tokens, float inv_temperature,
                                  float* log_probs, float* entropy, float* lse,
                                  cudaStream_t stream);

/// GAE over [batch, steps] row-major tensors, one thread per row (see NOTE
/// [masked scans] in kernels/gae.hpp); `values` null means all zero (with
/// lambda = 1 the advantages are then the discounted returns). mask: 0/1 bytes.
std::string launch_gae(const float* rewards, const float* values, const uint8_t* mask,
                       int64_t batch, int64_t steps, float gamma, float lambda, float* advantages,
                       float* returns, cudaStream_t stream);

/// fp64 version of launch_gae.
std::string launch_gae(const double* rewards, const double* values, const uint8_t* mask,
                       int64_t batch, int64_t steps, double gamma, double lambda,
                       double* advantages, double* returns, cudaStream_t stream);

/// Paged decode attention (NOTE [paged KV layout] in kernels/paged_attention.hpp),
/// one query token per request: q [requests, num_heads, head_dim] attends to
/// the first context_lens[r] tokens of request r, read through
/// block_tables [requests, max_blocks] (int32) from the pools [num_blocks,
/// block_size, num_kv_heads, head_dim]; query head h reads kv head
/// h / (num_heads / num_kv_heads). softmax(scale · q·kᵀ) in fp32 (online over
/// the blocks); out [requests, num_heads, head_dim]. q, pools and out share
/// `type`; all contiguous. head_dim <= 256; num_heads a multiple of
/// num_kv_heads and <= 65535. A request with context length 0 gets zeros.
std::string launch_paged_decode_attention(const void* q, const void* k_pool, const void* v_pool,
                                          float_type type, const int32_t* block_tables,
                                          int64_t max_blocks, const int64_t* context_lens,
                                          int64_t requests, int64_t num_heads, int64_t num_kv_heads,
                                          int64_t head_dim, int64_t block_size, float scale,
                                          void* out, cudaStream_t stream);

} // namespace troupe::kernels::cuda
