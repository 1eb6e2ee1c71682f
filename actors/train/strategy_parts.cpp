#include "actors/train/strategy_parts.hpp"

#include "runtime/collectives.hpp"
#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

namespace troupe::actors::train::detail {

namespace {

// One AdamW update of p with gradient g (same dtype as p): the moments and
// bias corrections of step t.
void adam_update(const optimizer_options& o, at::Tensor p, const at::Tensor& g, at::Tensor m,
                 at::Tensor v, double lr, int64_t t) {
  if (o.weight_decay != 0)
    p.mul_(1 - lr * o.weight_decay);
  const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(t));
  const double bc2 = 1 - std::pow(o.beta2, static_cast<double>(t));
  m.mul_(o.beta1).add_(g, 1 - o.beta1);
  v.mul_(o.beta2).addcmul_(g, g, 1 - o.beta2);
  auto denom = v.sqrt(); // the update's one temporary of p's size
  denom.div_(std::sqrt(bc2)).add_(o.eps);
  p.addcdiv_(m, denom, -lr / bc1);
}

} // namespace

void flat_adam::step(at::Tensor p, const at::Tensor& g, double lr) {
  torch::NoGradGuard no_grad;
  const bool mixed = has_master(p.scalar_type());
  if (mixed && !master.defined())
    master = p.to(at::kFloat);
  const auto& target = mixed ? master : p;
  if (!m.defined()) {
    m = at::zeros_like(target);
    v = at::zeros_like(target);
  }
  ++t;
  if (!mixed) {
    adam_update(o, p, g, m, v, lr, t);
    return;
  }
  // NOTE [mixed precision]: a chunk at a time, so the widened gradient and
  // the update's temporary stay small.
  constexpr int64_t chunk = int64_t{1} << 20;
  for (int64_t i = 0; i < p.numel(); i += chunk) {
    const int64_t n = std::min(chunk, p.numel() - i);
    auto w = master.narrow(0, i, n);
    adam_update(o, w, g.narrow(0, i, n).to(at::kFloat), m.narrow(0, i, n), v.narrow(0, i, n), lr,
                t);
    p.narrow(0, i, n).copy_(w);
  }
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
    if (master.defined())
      a.write("master", master);
    a.save_to(path);
    m = v = master = at::Tensor();
  }
  return freed;
}

void flat_adam::reload(const std::string& path) {
  torch::serialize::InputArchive a;
  a.load_from(path);
  a.read("exp_avg", m);
  a.read("exp_avg_sq", v);
  if (!a.try_read("master", master))
    master = at::Tensor();
}

expected<flat_adam::whole_state> flat_adam::read_state(torch::serialize::InputArchive& archive,
                                                       int64_t total, at::ScalarType weights) {
  at::Tensor step;
  whole_state s;
  if (!archive.try_read("optimizer/step", step))
    return make_error(errc::corrupted, "load_state: the state has no optimizer");
  const bool moments = archive.try_read("optimizer/exp_avg", s.exp_avg);
  auto fits = [&](const at::Tensor& x) {
    return x.numel() == total && at::isFloatingType(x.scalar_type());
  };
  if (moments != archive.try_read("optimizer/exp_avg_sq", s.exp_avg_sq) ||
      (moments && (!fits(s.exp_avg) || !fits(s.exp_avg_sq))))
    return make_error(errc::shape_mismatch,
                      "load_state: the optimizer moments do not fit this model (" +
                          std::to_string(s.exp_avg.defined() ? s.exp_avg.numel() : 0) +
                          " elements for " + std::to_string(total) + ")");
  if (archive.try_read("optimizer/master", s.master) && !fits(s.master))
    return make_error(errc::shape_mismatch,
                      "load_state: the master weights do not fit this model (" +
                          std::to_string(s.master.numel()) + " elements for " +
                          std::to_string(total) + ")");
  t = step.item<int64_t>();
  const auto dtype = optimizer_dtype(weights);
  if (moments) {
    s.exp_avg = s.exp_avg.reshape({-1}).to(dtype);
    s.exp_avg_sq = s.exp_avg_sq.reshape({-1}).to(dtype);
  } else {
    s.exp_avg = s.exp_avg_sq = at::Tensor();
  }
  s.master = has_master(weights) && s.master.defined() ? s.master.reshape({-1}).to(at::kFloat)
                                                       : at::Tensor();
  return s;
}

expected<double> clip_by_global_norm(at::Tensor& grads, runtime::process_group* group,
                                     double max_norm, const tp_norm& tp) {
  // [all, replicated, counted elsewhere] (NOTE [tensor-parallel norm]).
  auto sq = guarded("the gradient norm", [&] {
    auto of = [&](const std::vector<std::pair<int64_t, int64_t>>& ranges) {
      double sum = 0;
      for (auto [begin, end] : ranges)
        sum += squared_norm(grads.narrow(0, begin, end - begin));
      return sum;
    };
    return torch::tensor({squared_norm(grads), of(tp.replicated), of(tp.elsewhere)},
                         torch::kDouble);
  });
  if (!sq)
    return sq.error();
  if (group)
    if (auto ok = group->all_reduce_sum(*sq); !ok)
      return with_prefix(ok.error(), "summing the gradient norm over the group");
  if (tp.group) { // the split parts (and what another stage counts) over TP
    auto split = torch::stack({(*sq)[0] - (*sq)[1], (*sq)[2]});
    if (auto ok = tp.group->all_reduce_sum(split); !ok)
      return with_prefix(ok.error(), "summing the gradient norm over the tensor-parallel group");
    (*sq)[0] = split[0] + (*sq)[1];
    (*sq)[2] = split[1];
  }
  if (tp.pp) {
    auto whole = ((*sq)[0] - (*sq)[2]).reshape({1});
    if (auto ok = tp.pp->all_reduce_sum(whole); !ok)
      return with_prefix(ok.error(), "summing the gradient norm over the pipeline stages");
    (*sq)[0] = whole[0];
  }
  const double norm = std::sqrt((*sq)[0].item<double>());
  if (const double c = clip_coefficient(norm, max_norm); c < 1.0)
    grads.mul_(c);
  return norm;
}

} // namespace troupe::actors::train::detail
