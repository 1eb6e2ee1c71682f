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
  auto denom = v.sqrt(); // the step's one whole-size temporary
  denom.div_(std::sqrt(bc2)).add_(o.eps);
  p.addcdiv_(m, denom, -lr / bc1);
}

double squared_norm(const at::Tensor& g) {
  torch::NoGradGuard no_grad;
  constexpr int64_t chunk = int64_t{1} << 20;
  auto flat = g.reshape({-1});
  double sum = 0;
  for (int64_t i = 0; i < flat.numel(); i += chunk)
    sum += flat.narrow(0, i, std::min(chunk, flat.numel() - i))
               .to(at::kDouble)
               .pow(2)
               .sum()
               .item<double>();
  return sum;
}

} // namespace troupe::actors::train::detail
