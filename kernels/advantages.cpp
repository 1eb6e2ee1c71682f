#include "kernels/advantages.hpp"

#include "kernels/detail.hpp"
#include "kernels/masked.hpp"
#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

#include <string>
#include <tuple>

namespace troupe::kernels {

namespace {

caf::error check_scores(std::string_view fn, std::string_view name, const at::Tensor& scores,
                        const at::Tensor& mask) {
  if (auto err = detail::first_error({detail::require_dim(fn, name, scores, 1, "[B]"),
                                      detail::require_dim(fn, "mask", mask, 2, "[B, T]")}))
    return err;
  if (auto err = detail::first_error({detail::require_floating(fn, name, scores),
                                      detail::require_mask(fn, "mask", mask),
                                      detail::require_same_device(fn, "mask", mask, name, scores)}))
    return err;
  if (scores.size(0) != mask.size(0))
    return make_error(errc::shape_mismatch,
                      detail::cat(fn, ": ", name, " has shape ", detail::shape_str(scores),
                                  ", expected [", std::to_string(mask.size(0)),
                                  "] (one per row of mask ", detail::shape_str(mask), ")"));
  return {};
}

caf::error check_groups(std::string_view fn, const at::Tensor& scores,
                        const at::Tensor& group_ids) {
  return detail::first_error(
      {detail::require_integral(fn, "group_ids", group_ids),
       detail::require_same_shape(fn, "group_ids", group_ids, "scores", scores),
       detail::require_same_device(fn, "group_ids", group_ids, "scores", scores)});
}

struct group_stats {
  at::Tensor inverse; // [B] group index of each sample
  at::Tensor count;   // [B] size of the sample's group
  at::Tensor sum;     // [B] sum of the sample's group
  at::Tensor mean;    // [B] mean of the sample's group
};

group_stats stats_of(const at::Tensor& scores, const at::Tensor& group_ids) {
  auto [unique, inverse, counts] =
      at::_unique2(group_ids, /*sorted=*/true, /*return_inverse=*/true, /*return_counts=*/true);
  auto groups = unique.size(0);
  auto sums = at::zeros({groups}, scores.options()).index_add_(0, inverse, scores);
  auto count = counts.to(scores.scalar_type());
  group_stats st;
  st.inverse = inverse;
  st.count = count.index_select(0, inverse);
  st.sum = sums.index_select(0, inverse);
  st.mean = st.sum / st.count;
  return st;
}

at::Tensor broadcast(const at::Tensor& per_seq, const at::Tensor& mask) {
  auto valid = detail::as_bool_mask(mask);
  return at::where(valid, per_seq.unsqueeze(1), at::zeros({}, per_seq.options()));
}

at::Tensor as_compute(const at::Tensor& scores) {
  return scores.detach().to(detail::compute_type({scores}));
}

} // namespace

expected<at::Tensor> contiguous_group_ids(int64_t batch, int64_t group_size, at::Device device) {
  constexpr std::string_view fn = "contiguous_group_ids";
  if (group_size < 1 || batch < 0 || batch % group_size != 0)
    return make_error(errc::invalid_argument,
                      detail::cat(fn, ": batch ", std::to_string(batch),
                                  " must be a non-negative multiple of group_size ",
                                  std::to_string(group_size), " (>= 1)"));
  return guarded(fn, [&] {
    return at::arange(batch, at::TensorOptions().dtype(at::kLong).device(device))
        .div(group_size, "floor");
  });
}

expected<advantage_result> grpo_advantages(const at::Tensor& scores, const at::Tensor& mask,
                                           const at::Tensor& group_ids, const grpo_options& opts) {
  constexpr std::string_view fn = "grpo_advantages";
  if (auto err = check_scores(fn, "scores", scores, mask))
    return err;
  if (auto err = detail::first_error(
          {check_groups(fn, scores, group_ids), detail::require_range(fn, "eps", opts.eps, 0, 1)}))
    return err;
  return guarded(fn, [&] {
    at::NoGradGuard no_grad;
    auto s = as_compute(scores);
    auto st = stats_of(s, group_ids);
    auto dev = s - st.mean;
    auto adv = dev;
    if (opts.norm_by_std) {
      auto sq = at::zeros_like(s).index_add_(0, st.inverse, dev * dev).index_select(0, st.inverse);
      auto std = (sq / (st.count - 1).clamp_min(1)).sqrt();
      adv = dev / (std + opts.eps);
    }
    // NOTE [groups of one]: mean 0, std 1.
    auto alone = opts.norm_by_std ? s / (1.0 + opts.eps) : s;
    adv = at::where(st.count.gt(1), adv, alone);
    auto a = broadcast(adv, mask);
    return advantage_result{a, a};
  });
}

expected<advantage_result> rloo_advantages(const at::Tensor& scores, const at::Tensor& mask,
                                           const at::Tensor& group_ids) {
  constexpr std::string_view fn = "rloo_advantages";
  if (auto err = check_scores(fn, "scores", scores, mask))
    return err;
  if (auto err = check_groups(fn, scores, group_ids))
    return err;
  return guarded(fn, [&] {
    at::NoGradGuard no_grad;
    auto s = as_compute(scores);
    auto st = stats_of(s, group_ids);
    auto others = (st.sum - s) / (st.count - 1).clamp_min(1);
    auto adv = at::where(st.count.gt(1), s - others, s); // NOTE [groups of one]
    auto a = broadcast(adv, mask);
    return advantage_result{a, a};
  });
}

expected<advantage_result> reinforce_pp_advantages(const at::Tensor& token_rewards,
                                                   const at::Tensor& mask, double gamma) {
  auto returns = discounted_returns(token_rewards, mask, gamma);
  if (!returns)
    return with_prefix(returns.error(), "reinforce_pp_advantages");
  auto adv = masked_whiten(*returns, mask);
  if (!adv)
    return with_prefix(adv.error(), "reinforce_pp_advantages");
  return advantage_result{*adv, *returns};
}

expected<advantage_result> reinforce_pp_baseline_advantages(const at::Tensor& scores,
                                                            const at::Tensor& mask,
                                                            const at::Tensor& group_ids) {
  constexpr std::string_view fn = "reinforce_pp_baseline_advantages";
  if (auto err = check_scores(fn, "scores", scores, mask))
    return err;
  if (auto err = check_groups(fn, scores, group_ids))
    return err;
  auto centered = guarded(fn, [&] {
    at::NoGradGuard no_grad;
    auto s = as_compute(scores);
    auto st = stats_of(s, group_ids);
    // NOTE [groups of one]: a sample alone has mean 0.
    return broadcast(s - at::where(st.count.gt(1), st.mean, at::zeros_like(s)), mask);
  });
  if (!centered)
    return centered.error();
  auto adv = masked_whiten(*centered, mask);
  if (!adv)
    return with_prefix(adv.error(), fn);
  return advantage_result{*adv, *adv};
}

expected<advantage_result> remax_advantages(const at::Tensor& token_rewards,
                                            const at::Tensor& baseline_scores,
                                            const at::Tensor& mask) {
  constexpr std::string_view fn = "remax_advantages";
  if (auto err = check_scores(fn, "baseline_scores", baseline_scores, mask))
    return err;
  if (auto err = detail::first_error(
          {detail::require_floating(fn, "token_rewards", token_rewards),
           detail::require_same_shape(fn, "token_rewards", token_rewards, "mask", mask),
           detail::require_same_device(fn, "token_rewards", token_rewards, "mask", mask)}))
    return err;
  return guarded(fn, [&] {
    at::NoGradGuard no_grad;
    auto type = detail::compute_type({token_rewards, baseline_scores});
    auto valid = detail::as_bool_mask(mask);
    auto zero = at::zeros({}, token_rewards.options().dtype(type));
    auto r = at::where(valid, token_rewards.detach().to(type), zero);
    auto to_go = r.flip({1}).cumsum(1).flip({1});
    auto returns = at::where(valid, to_go, zero);
    auto adv = returns - broadcast(baseline_scores.detach().to(type), mask);
    return advantage_result{adv, returns};
  });
}

expected<at::Tensor> singleton_groups(const at::Tensor& group_ids) {
  constexpr std::string_view fn = "singleton_groups";
  if (auto err = detail::first_error({detail::require_dim(fn, "group_ids", group_ids, 1, "[B]"),
                                      detail::require_integral(fn, "group_ids", group_ids)}))
    return err;
  return guarded(fn, [&] {
    auto [unique, inverse, counts] =
        at::_unique2(group_ids, /*sorted=*/true, /*return_inverse=*/true, /*return_counts=*/true);
    return counts.index_select(0, inverse).eq(1).nonzero().flatten();
  });
}

expected<advantage_estimator> parse_advantage_estimator(std::string_view name) {
  if (auto e = enum_from_name<advantage_estimator>(name))
    return *e;
  std::string names;
  for (auto n : enum_choices<advantage_estimator>())
    names += (names.empty() ? "" : ", ") + std::string{n};
  return make_error(errc::invalid_argument,
                    "advantage estimator \"" + std::string{name} + "\": expected one of " + names);
}

expected<advantage_result> estimate_advantages(advantage_estimator e, const advantage_inputs& in) {
  switch (e) {
    case advantage_estimator::gae: {
      auto a = gae(in.token_rewards, in.values, in.mask, in.gamma, in.lam);
      if (!a || !in.whiten)
        return a;
      auto w = masked_whiten(a->advantages, in.mask);
      if (!w)
        return w.error();
      a->advantages = std::move(*w);
      return a;
    }
    case advantage_estimator::grpo:
      return grpo_advantages(in.scores, in.mask, in.group_ids, {.norm_by_std = in.norm_by_std});
    case advantage_estimator::rloo: return rloo_advantages(in.scores, in.mask, in.group_ids);
    case advantage_estimator::reinforce_pp:
      return reinforce_pp_advantages(in.token_rewards, in.mask, in.gamma);
    case advantage_estimator::reinforce_pp_baseline:
      return reinforce_pp_baseline_advantages(in.scores, in.mask, in.group_ids);
    case advantage_estimator::remax:
      if (!in.baseline_scores.defined())
        return make_error(errc::invalid_argument,
                          "remax: needs the greedy baseline's scores (baseline_scores)");
      return remax_advantages(in.token_rewards, in.baseline_scores, in.mask);
  }
  return make_error(errc::invalid_argument, "unknown advantage estimator");
}

expected<importance_weights> truncated_importance_weights(const at::Tensor& policy_log_probs,
                                                          const at::Tensor& behaviour_log_probs,
                                                          const at::Tensor& mask, double cap) {
  if (!(cap > 0))
    return make_error(errc::invalid_argument, "truncated_importance_weights: cap must be > 0");
  return guarded("truncated_importance_weights", [&]() -> expected<importance_weights> {
    auto ratio = torch::exp(policy_log_probs - behaviour_log_probs);
    importance_weights out;
    out.weights = ratio.clamp_max(cap) * mask;
    auto capped = masked_mean((ratio > cap).to(torch::kFloat), mask);
    if (!capped)
      return capped.error();
    out.capped_fraction = capped->item<double>();
    return out;
  });
}

} // namespace troupe::kernels
