#pragma once
// Attention over a paged KV cache: the compute half of the inference
// engine's paged KV memory (the block allocator and prefix cache live in
// actors/inference/).
//
// NOTE [paged KV layout]
// Per layer a K pool and a V pool, each [num_blocks, block_size, n_kv, D] in
// the model dtype, contiguous. Token slot s = block_id · block_size + offset;
// the pool viewed as [num_blocks · block_size, n_kv, D] is indexed by slot.
// A scheduled step is a "varlen" batch of R requests, request r contributing
// n_r >= 1 new tokens (a prefill chunk or one decode token), concatenated
// into N = Σ n_r token rows:
//   query_start [R + 1] int64: request r's new tokens are rows
//       query_start[r] .. query_start[r + 1] − 1 (query_start[0] = 0,
//       query_start[R] = N);
//   context_lens [R] int64: tokens in the cache for request r INCLUDING this
//       step's new ones (so context_lens[r] >= n_r);
//   block_tables [R, max_blocks] int32 or int64: request r's token at
//       position p lives in block block_tables[r][p / block_size], offset
//       p % block_size. Only the first ceil(context_lens[r] / block_size)
//       entries are read; the rest may hold anything.
// Causality: request r's j-th new token (0-based, of n_r) sits at absolute
// position context_lens[r] − n_r + j and attends to positions 0 .. itself.
// Grouped-query attention: query head h reads kv head h / (H / n_kv) (HF
// repeat_kv). Blocks may be shared between requests (prefix sharing): reads
// never write, and write_kv writes only the slots it is given.
//
// The metadata tensors (block_tables, context_lens, query_start) are small;
// they may live on the CPU or on q's device, and are copied to the host for
// validation. Nothing here records autograd history (inference only).
//
// Devices: a CPU step where every n_r = 1 in fp32/fp64 runs a paged decode
// loop that reads K/V through the block tables in place (parallel over
// requests x kv heads); other CPU steps run ATen gather/index ops (a padded
// batched matmul for bf16/fp16 decodes, one masked matmul per request
// otherwise). CUDA tensors run the
// paged decode kernel (kernels/cuda/paged_attention.cu: K/V read through the
// block tables, online softmax) when every n_r = 1, the pools are fp32, fp16
// or bf16, D <= 256 and the build has the kernel; any other CUDA step (prefill
// chunks, fp64) runs the same ATen gather path as the CPU, on the device.

#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>

namespace troupe::kernels {

/// k, v [N, n_kv, D] (the pools' dtype) → k_pool, v_pool at slot_mapping [N]
/// (integer slots in [0, num_blocks · block_size), distinct). Pools must be
/// contiguous [num_blocks, block_size, n_kv, D] on k's device.
expected<void> write_kv(at::Tensor& k_pool, at::Tensor& v_pool, const at::Tensor& k,
                        const at::Tensor& v, const at::Tensor& slot_mapping);

/// q [N, H, D] (the pools' dtype) over the paged cache (NOTE [paged KV
/// layout]) → out [N, H, D] in q's dtype; softmax(scale · q·kᵀ) computed in
/// fp32 (fp64 for fp64 inputs).
expected<at::Tensor> paged_attention(const at::Tensor& q, const at::Tensor& k_pool,
                                     const at::Tensor& v_pool, const at::Tensor& block_tables,
                                     const at::Tensor& context_lens, const at::Tensor& query_start,
                                     double scale);

} // namespace troupe::kernels
