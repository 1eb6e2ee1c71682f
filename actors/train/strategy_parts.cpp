#include "actors/train/strategy_parts.hpp"

#include <torch/torch.h>

namespace troupe::actors::train::detail {

void flat_adam::step(at::Tensor p, const at::Tensor& g, double lr) {
  torch::NoGradGuard no_grad;
  if (!m.defined()) {
    m = at::zeros_like(p);
    v = at::zeros_like(p);
  }
  if (o.weight_decay != 0)
    p.mul_(1 - lr * o.weight_decay);
  ++t;
  const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(t));
  const double bc2 = 1 - std::pow(o.beta2, static_cast<double>(t));
  m.mul_(o.beta1).add_(g, 1 - o.beta1);
  v.mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
  auto denom = (v.sqrt() / std::sqrt(bc2)).add_(o.eps);
  p.addcdiv_(m, denom, -lr / bc1);
}

} // namespace troupe::actors::train::detail
