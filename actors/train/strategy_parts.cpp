#include "actors/train/strategy_parts.hpp"

#include "runtime/collectives.hpp"
#include "runtime/torch_guard.hpp"

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
  for (int64_t i = 0; i < flat.numel(); i += chunk) {
    auto part = flat.narrow(0, i, std::min(chunk, flat.numel() - i)).to(at::kDouble);
    sum += part.dot(part).item<double>(); // the chunk's one double copy
  }
  return sum;
}

int64_t flat_adam::offload(const std::string& path) {
  const int64_t freed = bytes();
  if (freed > 0) {
    torch::serialize::OutputArchive a;
    a.write("exp_avg", m);
    a.write("exp_avg_sq", v);
    a.save_to(path);
    m = v = at::Tensor();
  }
  return freed;
}

void flat_adam::reload(const std::string& path) {
  torch::serialize::InputArchive a;
  a.load_from(path);
  a.read("exp_avg", m);
  a.read("exp_avg_sq", v);
}

expected<std::optional<std::pair<at::Tensor, at::Tensor>>>
flat_adam::read_state(torch::serialize::InputArchive& archive, int64_t total,
                      at::ScalarType dtype) {
  at::Tensor step, exp_avg, exp_avg_sq;
  if (!archive.try_read("optimizer/step", step))
    return make_error(errc::corrupted, "load_state: the state has no optimizer");
  const bool moments = archive.try_read("optimizer/exp_avg", exp_avg);
  if (moments != archive.try_read("optimizer/exp_avg_sq", exp_avg_sq) ||
      (moments &&
       (exp_avg.numel() != total || exp_avg_sq.numel() != total || exp_avg.scalar_type() != dtype)))
    return make_error(errc::shape_mismatch,
                      "load_state: the optimizer moments do not fit this model (" +
                          std::to_string(exp_avg.defined() ? exp_avg.numel() : 0) +
                          " elements for " + std::to_string(total) + ")");
  t = step.item<int64_t>();
  if (!moments)
    return std::optional<std::pair<at::Tensor, at::Tensor>>{};
  return std::optional{std::pair{exp_avg.reshape({-1}), exp_avg_sq.reshape({-1})}};
}

expected<double> clip_by_global_norm(at::Tensor& grads, runtime::process_group* group,
                                     double max_norm) {
  auto sq = guarded("the gradient norm",
                    [&] { return torch::tensor({squared_norm(grads)}, torch::kDouble); });
  if (!sq)
    return sq.error();
  if (group)
    if (auto ok = group->all_reduce_sum(*sq); !ok)
      return with_prefix(ok.error(), "summing the gradient norm over the group");
  const double norm = std::sqrt(sq->item<double>());
  if (const double c = clip_coefficient(norm, max_norm); c < 1.0)
    grads.mul_(c);
  return norm;
}

} // namespace troupe::actors::train::detail
