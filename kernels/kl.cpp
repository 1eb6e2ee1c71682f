#include "kernels/kl.hpp"

#include <algorithm>

#include "kernels/detail.hpp"
#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

#include <string>

namespace troupe::kernels {

expected<kl_estimator> parse_kl_estimator(std::string_view name) {
  if (auto e = enum_from_name<kl_estimator>(name))
    return *e;
  return make_error(
      errc::invalid_argument,
      "kl estimator: expected one of \"k1\", \"abs\", \"k2\", \"k3\", \"k1+\", "
      "\"k3+\" (aliases \"kl\", \"mse\", \"low_var_kl\", \"kl+\", \"low_var_kl+\"), got \"" +
          std::string{name} + "\"");
}

expected<at::Tensor> kl_penalty(const at::Tensor& log_probs, const at::Tensor& ref_log_probs,
                                kl_estimator est) {
  constexpr std::string_view fn = "kl_penalty";
  if (auto err = detail::first_error(
          {detail::require_floating(fn, "log_probs", log_probs),
           detail::require_floating(fn, "ref_log_probs", ref_log_probs),
           detail::require_same_shape(fn, "ref_log_probs", ref_log_probs, "log_probs", log_probs),
           detail::require_same_device(fn, "ref_log_probs", ref_log_probs, "log_probs",
                                       log_probs)}))
    return err;
  return guarded(fn, [&] {
    auto x = log_probs - ref_log_probs;
    // NOTE [k3 clamp]
    auto k3 = [](const at::Tensor& d) {
      auto c = d.clamp(-20.0, 20.0);
      return (at::expm1(-c) + c).clamp(-10.0, 10.0);
    };
    // Straight-through: `value`'s value, k2's gradient.
    auto straight_through = [&](const at::Tensor& value) {
      auto k2 = 0.5 * x * x;
      return k2 - k2.detach() + value.detach();
    };
    switch (est) {
    case kl_estimator::k1:
      return x;
    case kl_estimator::abs:
      return x.abs();
    case kl_estimator::k2:
      return 0.5 * x * x;
    case kl_estimator::k3:
      return k3(x);
    case kl_estimator::k1_st:
      return straight_through(x);
    case kl_estimator::k3_st:
      return straight_through(k3(x));
    }
    return x;
  });
}

double adaptive_kl_coef(double beta, double kl, double target, int64_t samples, int64_t horizon) {
  double err = std::clamp(kl / target - 1.0, -0.2, 0.2);
  return beta * (1.0 + err * static_cast<double>(samples) / static_cast<double>(horizon));
}

} // namespace troupe::kernels
