#include "kernels/gae.hpp"

#include "kernels/detail.hpp"
#include "kernels/gae_scan.hpp"
#include "runtime/torch_guard.hpp"

#include <ATen/Parallel.h>
#include <torch/torch.h>

namespace troupe::kernels {

namespace {

// See NOTE [masked scans]. `values` may be null (all zero).
template <class T>
void scan_rows(const T* rewards, const T* values, const bool* mask, int64_t batch, int64_t steps,
               T gamma, T lambda, T* advantages, T* returns) {
  at::parallel_for(0, batch, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      detail::gae_scan_row(rewards, values, mask, b, steps, gamma, lambda, advantages, returns);
  });
}

caf::error check_inputs(std::string_view fn, const at::Tensor& rewards, const at::Tensor* values,
                        const at::Tensor& mask, double gamma, double lambda) {
  if (auto err = detail::require_dim(fn, "rewards", rewards, 2, "[B, T]"))
    return err;
  if (values) {
    if (auto err = detail::first_error(
            {detail::require_floating(fn, "values", *values),
             detail::require_same_shape(fn, "values", *values, "rewards", rewards),
             detail::require_same_device(fn, "values", *values, "rewards", rewards)}))
      return err;
  }
  return detail::first_error({detail::require_floating(fn, "rewards", rewards),
                              detail::require_mask(fn, "mask", mask),
                              detail::require_same_shape(fn, "mask", mask, "rewards", rewards),
                              detail::require_same_device(fn, "mask", mask, "rewards", rewards),
                              detail::require_range(fn, "gamma", gamma, 0.0, 1.0),
                              detail::require_range(fn, "lambda", lambda, 0.0, 1.0)});
}

expected<advantage_result> run_scan(std::string_view fn, const at::Tensor& rewards,
                                    const at::Tensor& values, const at::Tensor& mask, double gamma,
                                    double lambda) {
  if (!rewards.device().is_cpu()) {
#if defined(TROUPE_TORCH_CUDA)
    if (!rewards.is_cuda())
      return detail::unsupported_device(fn, "rewards", rewards);
#else
    return detail::unsupported_device(fn, "rewards", rewards);
#endif
  }
  return guarded(fn, [&] {
    at::NoGradGuard no_grad;
    auto type = detail::compute_type({rewards, values});
    auto r = rewards.detach().to(type).contiguous();
    auto v = values.defined() ? values.detach().to(type).contiguous() : at::Tensor{};
    auto m = detail::as_bool_mask(mask).contiguous();
    advantage_result out{at::empty_like(r), at::empty_like(r)};
#if defined(TROUPE_TORCH_CUDA)
    if (r.is_cuda()) {
      detail::cuda_gae(r, v, m, gamma, lambda, out.advantages, out.returns);
      return out;
    }
#endif
    AT_DISPATCH_FLOATING_TYPES(type, "troupe_gae", [&] {
      scan_rows<scalar_t>(r.data_ptr<scalar_t>(), v.defined() ? v.data_ptr<scalar_t>() : nullptr,
                          m.data_ptr<bool>(), r.size(0), r.size(1), static_cast<scalar_t>(gamma),
                          static_cast<scalar_t>(lambda), out.advantages.data_ptr<scalar_t>(),
                          out.returns.data_ptr<scalar_t>());
    });
    return out;
  });
}

} // namespace

expected<advantage_result> gae(const at::Tensor& rewards, const at::Tensor& values,
                               const at::Tensor& mask, double gamma, double lambda) {
  if (auto err = check_inputs("gae", rewards, &values, mask, gamma, lambda))
    return err;
  return run_scan("gae", rewards, values, mask, gamma, lambda);
}

expected<at::Tensor> discounted_returns(const at::Tensor& rewards, const at::Tensor& mask,
                                        double gamma) {
  constexpr std::string_view fn = "discounted_returns";
  if (auto err = check_inputs(fn, rewards, nullptr, mask, gamma, 1.0))
    return err;
  auto out = run_scan(fn, rewards, at::Tensor{}, mask, gamma, 1.0);
  if (!out)
    return out.error();
  return std::move(out->advantages);
}

} // namespace troupe::kernels
