#pragma once
// Internal to kernels/: argument checks that build troupe errors naming the
// function and the argument, and small helpers shared by the .cpp files.
// Not installed; other folders include the public headers only.

#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <string>
#include <string_view>

namespace troupe::kernels::detail {

/// "[4, 7]" for a tensor of shape (4, 7); "undefined" for an undefined tensor.
std::string shape_str(const at::Tensor& t);

/// An error unless `t` is defined.
caf::error require_defined(std::string_view fn, std::string_view name, const at::Tensor& t);

/// An error unless `t` has `dim` dimensions; `layout` names them ("[B, T]").
caf::error require_dim(std::string_view fn, std::string_view name, const at::Tensor& t, int64_t dim,
                       std::string_view layout);

/// An error unless `t` has the shape of `ref`: "fn: values has shape [4, 7],
/// expected [4, 8] like rewards".
caf::error require_same_shape(std::string_view fn, std::string_view name, const at::Tensor& t,
                              std::string_view ref_name, const at::Tensor& ref);

/// An error unless `t` has a floating-point dtype.
caf::error require_floating(std::string_view fn, std::string_view name, const at::Tensor& t);

/// An error unless `t` has an integral (non-bool) dtype.
caf::error require_integral(std::string_view fn, std::string_view name, const at::Tensor& t);

/// An error unless `t` is a mask: bool, integral or floating dtype.
caf::error require_mask(std::string_view fn, std::string_view name, const at::Tensor& t);

/// An error unless `t` lives on the device of `ref`.
caf::error require_same_device(std::string_view fn, std::string_view name, const at::Tensor& t,
                               std::string_view ref_name, const at::Tensor& ref);

/// An error unless `lo <= x <= hi` (bounds inclusive as flagged) and x is finite.
caf::error require_range(std::string_view fn, std::string_view name, double x, double lo, double hi,
                         bool lo_inclusive = true, bool hi_inclusive = true);

/// The dtype kernels compute in: fp64 if any input is fp64, else fp32.
at::ScalarType compute_type(std::initializer_list<at::Tensor> inputs);

/// `mask` as a bool tensor (nonzero = valid).
at::Tensor as_bool_mask(const at::Tensor& mask);

/// errc::unsupported for a tensor on a device this build has no kernel for.
caf::error unsupported_device(std::string_view fn, std::string_view name, const at::Tensor& t);

/// Concatenates strings, string views, C strings and characters (one
/// allocation; also sidesteps GCC 12's -Warray-bounds false positive on
/// chains of std::string operator+).
template <class... Ts>
std::string cat(const Ts&... parts) {
  std::string out;
  (out += ... += parts);
  return out;
}

/// Returns the first error of a list of checks (an empty error if none).
inline caf::error first_error(std::initializer_list<caf::error> errors) {
  for (const auto& err : errors)
    if (err)
      return err;
  return {};
}

} // namespace troupe::kernels::detail

#if defined(TROUPE_TORCH_CUDA)
// The at::Tensor glue to the CUDA launchers (kernels/cuda_glue.cpp). These
// throw std::runtime_error on a CUDA failure; callers run them under guarded().
namespace troupe::kernels::detail {

/// Outputs of the fused log-prob kernel, fp32 [rows].
struct fused_logprobs {
  at::Tensor log_probs; // undefined when no tokens were given
  at::Tensor entropy;   // undefined unless requested
  at::Tensor lse;       // logsumexp(logits / τ) per row
};

/// Whether the fused kernel takes logits of this dtype (fp32, fp16, bf16).
bool cuda_logprobs_supports(at::ScalarType type);

/// logits2d [rows, V] (CUDA, last dim contiguous), tokens1d [rows] int64 or undefined.
fused_logprobs cuda_token_logprobs(const at::Tensor& logits2d, const at::Tensor& tokens1d,
                                   bool want_entropy, double inv_temperature);

/// GAE (or, with `values` undefined and lambda = 1, discounted returns) over
/// [B, T] CUDA tensors of dtype fp32 or fp64; `mask` is bool. Fills both outputs.
void cuda_gae(const at::Tensor& rewards, const at::Tensor& values, const at::Tensor& mask,
              double gamma, double lambda, at::Tensor& advantages, at::Tensor& returns);

} // namespace troupe::kernels::detail
#endif
