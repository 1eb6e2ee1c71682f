// at::Tensor glue to the raw CUDA launchers (kernels/cuda/launchers.hpp).
// Builds only against a CUDA-enabled LibTorch (TROUPE_TORCH_CUDA); with a
// CPU LibTorch this file is empty and CUDA tensors get errc::unsupported.

#if defined(TROUPE_TORCH_CUDA)

#include "kernels/cuda/launchers.hpp"
#include "kernels/detail.hpp"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/torch.h>

#include <stdexcept>

namespace troupe::kernels::detail {

namespace {

void throw_if(const std::string& msg) {
  if (!msg.empty())
    throw std::runtime_error(msg);
}

float* ptr_or_null(at::Tensor& t) {
  return t.defined() ? t.data_ptr<float>() : nullptr;
}

} // namespace

bool cuda_logprobs_supports(at::ScalarType type) {
  return type == at::kFloat || type == at::kHalf || type == at::kBFloat16;
}

fused_logprobs cuda_token_logprobs(const at::Tensor& logits2d, const at::Tensor& tokens1d,
                                   bool want_entropy, double inv_temperature) {
  c10::cuda::CUDAGuard device_guard{logits2d.device()};
  auto logits = logits2d.stride(1) == 1 ? logits2d : logits2d.contiguous();
  auto rows = logits.size(0);
  auto opts = logits.options().dtype(at::kFloat);
  fused_logprobs out;
  out.lse = at::empty({rows}, opts);
  at::Tensor tokens;
  if (tokens1d.defined()) {
    tokens = tokens1d.to(at::kLong).contiguous();
    out.log_probs = at::empty({rows}, opts);
  }
  if (want_entropy)
    out.entropy = at::empty({rows}, opts);
  cuda::float_type type = cuda::float_type::f32;
  if (logits.scalar_type() == at::kHalf)
    type = cuda::float_type::f16;
  else if (logits.scalar_type() == at::kBFloat16)
    type = cuda::float_type::bf16;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream(logits.device().index()).stream();
  throw_if(cuda::launch_token_logprobs(
      logits.data_ptr(), type, rows, logits.size(1), logits.stride(0),
      tokens.defined() ? tokens.data_ptr<int64_t>() : nullptr, static_cast<float>(inv_temperature),
      ptr_or_null(out.log_probs), ptr_or_null(out.entropy), out.lse.data_ptr<float>(), stream));
  return out;
}

void cuda_gae(const at::Tensor& rewards, const at::Tensor& values, const at::Tensor& mask,
              double gamma, double lambda, at::Tensor& advantages, at::Tensor& returns) {
  c10::cuda::CUDAGuard device_guard{rewards.device()};
  auto mask_bytes = mask.to(at::kBool).contiguous();
  const auto* m = reinterpret_cast<const uint8_t*>(mask_bytes.data_ptr<bool>());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream(rewards.device().index()).stream();
  auto batch = rewards.size(0);
  auto steps = rewards.size(1);
  if (rewards.scalar_type() == at::kDouble) {
    throw_if(cuda::launch_gae(rewards.data_ptr<double>(),
                              values.defined() ? values.data_ptr<double>() : nullptr, m, batch,
                              steps, gamma, lambda, advantages.data_ptr<double>(),
                              returns.data_ptr<double>(), stream));
  } else {
    throw_if(cuda::launch_gae(rewards.data_ptr<float>(),
                              values.defined() ? values.data_ptr<float>() : nullptr, m, batch,
                              steps, static_cast<float>(gamma), static_cast<float>(lambda),
                              advantages.data_ptr<float>(), returns.data_ptr<float>(), stream));
  }
}

namespace {

cuda::float_type float_type_of(at::ScalarType type) {
  if (type == at::kHalf)
    return cuda::float_type::f16;
  if (type == at::kBFloat16)
    return cuda::float_type::bf16;
  return cuda::float_type::f32;
}

} // namespace

bool cuda_paged_decode_supports(at::ScalarType type, int64_t head_dim) {
  return (type == at::kFloat || type == at::kHalf || type == at::kBFloat16) && head_dim >= 1 &&
         head_dim <= 256;
}

at::Tensor cuda_paged_decode_attention(const at::Tensor& q, const at::Tensor& k_pool,
                                       const at::Tensor& v_pool, const at::Tensor& block_tables,
                                       const at::Tensor& context_lens, double scale) {
  c10::cuda::CUDAGuard device_guard{q.device()};
  auto query = q.contiguous();
  auto tables = block_tables.to(q.device(), at::kInt).contiguous();
  auto lens = context_lens.to(q.device(), at::kLong).contiguous();
  auto out = at::empty_like(query);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream(q.device().index()).stream();
  throw_if(cuda::launch_paged_decode_attention(
      query.data_ptr(), k_pool.data_ptr(), v_pool.data_ptr(), float_type_of(q.scalar_type()),
      tables.data_ptr<int32_t>(), tables.size(1), lens.data_ptr<int64_t>(), query.size(0),
      query.size(1), k_pool.size(2), k_pool.size(3), k_pool.size(1), static_cast<float>(scale),
      out.data_ptr(), stream));
  return out;
}

} // namespace troupe::kernels::detail

#endif // TROUPE_TORCH_CUDA
