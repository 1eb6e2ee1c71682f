#include "kernels/losses.hpp"

#include "kernels/detail.hpp"
#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>

namespace troupe::kernels {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// `names[i]` of `ts[i]` must be floating, [B, T] and shaped like ts[0]; mask too.
caf::error check_tokens2d(std::string_view fn, std::initializer_list<std::string_view> names,
                          std::initializer_list<const at::Tensor*> ts, const at::Tensor& mask) {
  auto name = names.begin();
  const at::Tensor& ref = **ts.begin();
  std::string_view ref_name = *names.begin();
  if (auto err = detail::require_dim(fn, ref_name, ref, 2, "[B, T]"))
    return err;
  for (const at::Tensor* t : ts) {
    if (auto err = detail::first_error({detail::require_floating(fn, *name, *t),
                                        detail::require_same_shape(fn, *name, *t, ref_name, ref),
                                        detail::require_same_device(fn, *name, *t, ref_name, ref)}))
      return err;
    ++name;
  }
  return detail::first_error({detail::require_mask(fn, "mask", mask),
                              detail::require_same_shape(fn, "mask", mask, ref_name, ref),
                              detail::require_same_device(fn, "mask", mask, ref_name, ref)});
}

// Mean over valid tokens, detached (a diagnostic).
at::Tensor valid_mean(const at::Tensor& x, const at::Tensor& valid) {
  auto count = valid.sum().to(x.scalar_type());
  auto sum = at::where(valid, x, at::zeros({}, x.options())).sum();
  return at::where(count.gt(0), sum / count.clamp_min(1), at::zeros({}, x.options())).detach();
}

at::Tensor unwrap(expected<at::Tensor> x) {
  if (!x)
    throw std::runtime_error(describe(x.error()));
  return std::move(*x);
}

} // namespace

namespace {

// The checks every policy loss makes: its tensors, and its clips (the
// lower one below 1 unless `any_floor`).
caf::error check_policy_loss(std::string_view fn, const at::Tensor& log_probs,
                             const at::Tensor& old_log_probs, const at::Tensor& advantages,
                             const at::Tensor& mask, const policy_loss_options& opts,
                             bool any_floor = false) {
  if (auto err = check_tokens2d(fn, {"log_probs", "old_log_probs", "advantages"},
                                {&log_probs, &old_log_probs, &advantages}, mask))
    return err;
  return detail::first_error(
      {detail::require_range(fn, "clip_low", opts.clip_low, 0.0, any_floor ? kInf : 1.0, true,
                             false),
       detail::require_range(fn, "clip_high", opts.clip_high, 0.0, kInf, true, false),
       detail::require_range(fn, "loss_scale_factor", opts.loss_scale_factor, 0.0, kInf, true,
                             false),
       opts.dual_clip_c
           ? detail::require_range(fn, "dual_clip_c", *opts.dual_clip_c, 1.0, kInf, false, false)
           : caf::error{}});
}

} // namespace

expected<policy_loss_result> ppo_policy_loss(const at::Tensor& log_probs,
                                             const at::Tensor& old_log_probs,
                                             const at::Tensor& advantages, const at::Tensor& mask,
                                             const policy_loss_options& opts) {
  constexpr std::string_view fn = "ppo_policy_loss";
  if (auto err = check_policy_loss(fn, log_probs, old_log_probs, advantages, mask, opts))
    return err;
  return guarded(fn, [&]() -> expected<policy_loss_result> {
    auto valid = detail::as_bool_mask(mask);
    auto adv = advantages.detach();
    auto log_ratio = (log_probs - old_log_probs.detach()).clamp(-20.0, 20.0);
    auto ratio = log_ratio.exp();
    auto loss1 = -adv * ratio;
    auto loss2 = -adv * ratio.clamp(1.0 - opts.clip_low, 1.0 + opts.clip_high);
    auto clipped = at::maximum(loss1, loss2);
    policy_loss_result out;
    out.pg_clipfrac = valid_mean(loss2.gt(loss1).to(loss1.scalar_type()), valid);
    auto per_token = clipped;
    if (opts.dual_clip_c) {
      auto loss3 = -adv * *opts.dual_clip_c;
      auto negative = adv.lt(0);
      per_token = at::where(negative, at::minimum(clipped, loss3), clipped);
      out.pg_clipfrac_lower =
          valid_mean(clipped.gt(loss3).logical_and(negative).to(loss1.scalar_type()), valid);
    } else {
      out.pg_clipfrac_lower = at::zeros({}, loss1.options());
    }
    out.ppo_kl = valid_mean(-log_ratio.detach(), valid);
    out.loss = unwrap(aggregate_loss(per_token, mask, opts.agg, opts.loss_scale_factor));
    return out;
  });
}

expected<policy_loss_result> gspo_policy_loss(const at::Tensor& log_probs,
                                              const at::Tensor& old_log_probs,
                                              const at::Tensor& advantages, const at::Tensor& mask,
                                              const policy_loss_options& opts) {
  constexpr std::string_view fn = "gspo_policy_loss";
  if (auto err = check_policy_loss(fn, log_probs, old_log_probs, advantages, mask, opts))
    return err;
  return guarded(fn, [&]() -> expected<policy_loss_result> {
    auto valid = detail::as_bool_mask(mask);
    auto zero = at::zeros({}, log_probs.options());
    auto adv = advantages.detach();
    auto log_ratio = at::where(valid, log_probs - old_log_probs.detach(), zero);
    auto lengths = valid.sum(1, /*keepdim=*/true).to(log_probs.scalar_type()).clamp_min(1);
    auto seq_log_ratio = log_ratio.sum(1, /*keepdim=*/true) / lengths;
    // s_i,t = sg(s_i) · π/sg(π): the value s_i, the gradient s_i·∇log π.
    auto token_form = (log_probs - log_probs.detach() + seq_log_ratio.detach()).clamp_max(10.0);
    auto ratio = token_form.exp();
    auto loss1 = -adv * ratio;
    auto loss2 = -adv * ratio.clamp(1.0 - opts.clip_low, 1.0 + opts.clip_high);
    auto per_token = at::maximum(loss1, loss2);
    policy_loss_result out;
    out.pg_clipfrac = valid_mean(loss2.gt(loss1).to(loss1.scalar_type()), valid);
    out.pg_clipfrac_lower = at::zeros({}, loss1.options());
    out.ppo_kl = valid_mean(-log_ratio.detach(), valid);
    out.loss = unwrap(aggregate_loss(per_token, mask, loss_agg_mode::seq_mean_token_mean));
    return out;
  });
}

expected<policy_loss_result> cispo_policy_loss(const at::Tensor& log_probs,
                                               const at::Tensor& old_log_probs,
                                               const at::Tensor& advantages, const at::Tensor& mask,
                                               const policy_loss_options& opts) {
  constexpr std::string_view fn = "cispo_policy_loss";
  if (auto err = check_policy_loss(fn, log_probs, old_log_probs, advantages, mask, opts,
                                   /*any_floor=*/true))
    return err;
  return guarded(fn, [&]() -> expected<policy_loss_result> {
    auto valid = detail::as_bool_mask(mask);
    auto log_ratio = (log_probs - old_log_probs.detach()).clamp(-20.0, 20.0);
    auto ratio = log_ratio.exp().detach();
    auto weight = ratio.clamp(1.0 - opts.clip_low, 1.0 + opts.clip_high);
    auto per_token = -advantages.detach() * weight * log_probs;
    policy_loss_result out;
    out.pg_clipfrac = valid_mean(weight.ne(ratio).to(log_probs.scalar_type()), valid);
    out.pg_clipfrac_lower = at::zeros({}, log_probs.options());
    out.ppo_kl = valid_mean(-log_ratio.detach(), valid);
    out.loss = unwrap(aggregate_loss(per_token, mask, opts.agg, opts.loss_scale_factor));
    return out;
  });
}

loss_agg_mode effective_agg(const policy_loss_spec& spec) {
  return spec.kind == policy_loss_kind::gspo ? loss_agg_mode::seq_mean_token_mean
                                             : spec.options.agg;
}

expected<actor_loss_result> actor_loss(const actor_loss_inputs& in, const policy_loss_spec& spec) {
  constexpr std::string_view fn = "actor_loss";
  if (!std::isfinite(spec.entropy_coef) || !(spec.kl_coef >= 0) || !std::isfinite(spec.kl_coef))
    return make_error(errc::invalid_argument,
                      detail::cat(fn, ": entropy_coef must be finite and kl_coef >= 0 and finite"));
  if (spec.kl_coef > 0 && !in.ref_log_probs.defined())
    return make_error(errc::invalid_argument,
                      detail::cat(fn, ": kl_coef > 0 needs the reference's log-probs"));
  auto pg = [&]() {
    switch (spec.kind) {
    case policy_loss_kind::gspo:
      return gspo_policy_loss(in.log_probs, in.old_log_probs, in.advantages, in.mask, spec.options);
    case policy_loss_kind::cispo:
      return cispo_policy_loss(in.log_probs, in.old_log_probs, in.advantages, in.mask,
                               spec.options);
    case policy_loss_kind::ppo:
      break;
    }
    return ppo_policy_loss(in.log_probs, in.old_log_probs, in.advantages, in.mask, spec.options);
  }();
  if (!pg)
    return pg.error();
  const auto agg = effective_agg(spec);
  const double factor = spec.options.loss_scale_factor;
  actor_loss_result out;
  out.pg = std::move(*pg);
  out.loss = out.pg.loss;
  if (in.entropy.defined()) {
    auto e = entropy_bonus(in.entropy, in.mask, agg, factor);
    if (!e)
      return with_prefix(e.error(), fn);
    out.entropy = *e;
    if (spec.entropy_coef != 0)
      out.loss = out.loss - spec.entropy_coef * out.entropy;
  }
  if (spec.kl_coef > 0) {
    auto kl = kl_loss(in.log_probs, in.ref_log_probs, in.mask, spec.kl, agg, factor);
    if (!kl)
      return with_prefix(kl.error(), fn);
    out.kl_loss = *kl;
    out.loss = out.loss + spec.kl_coef * out.kl_loss;
  }
  return out;
}

expected<value_loss_result> value_loss(const at::Tensor& values, const at::Tensor& old_values,
                                       const at::Tensor& returns, const at::Tensor& mask,
                                       const value_loss_options& opts) {
  constexpr std::string_view fn = "value_loss";
  if (auto err = check_tokens2d(fn, {"values", "old_values", "returns"},
                                {&values, &old_values, &returns}, mask))
    return err;
  if (opts.clip)
    if (auto err = detail::require_range(fn, "clip", *opts.clip, 0.0, kInf, false, false))
      return err;
  return guarded(fn, [&]() -> expected<value_loss_result> {
    auto valid = detail::as_bool_mask(mask);
    auto target = returns.detach();
    auto loss1 = (values - target).pow(2);
    auto per_token = loss1;
    value_loss_result out;
    if (opts.clip) {
      auto old = old_values.detach();
      auto clipped = at::maximum(at::minimum(values, old + *opts.clip), old - *opts.clip);
      auto loss2 = (clipped - target).pow(2);
      per_token = at::maximum(loss1, loss2);
      out.vf_clipfrac = valid_mean(loss2.gt(loss1).to(loss1.scalar_type()), valid);
    } else {
      out.vf_clipfrac = at::zeros({}, loss1.options());
    }
    auto loss = aggregate_loss(per_token, mask, opts.agg, opts.loss_scale_factor);
    if (!loss)
      return loss.error();
    out.loss = 0.5 * *loss;
    return out;
  });
}

expected<at::Tensor> entropy_bonus(const at::Tensor& entropy, const at::Tensor& mask,
                                   loss_agg_mode agg, double scale_factor) {
  auto out = aggregate_loss(entropy, mask, agg, scale_factor);
  if (!out)
    return with_prefix(out.error(), "entropy_bonus");
  return out;
}

expected<at::Tensor> kl_loss(const at::Tensor& log_probs, const at::Tensor& ref_log_probs,
                             const at::Tensor& mask, kl_estimator est, loss_agg_mode agg,
                             double scale_factor) {
  constexpr std::string_view fn = "kl_loss";
  if (auto err =
          check_tokens2d(fn, {"log_probs", "ref_log_probs"}, {&log_probs, &ref_log_probs}, mask))
    return err;
  auto kl = kl_penalty(log_probs, ref_log_probs.detach(), est);
  if (!kl)
    return with_prefix(kl.error(), fn);
  auto out = aggregate_loss(*kl, mask, agg, scale_factor);
  if (!out)
    return with_prefix(out.error(), fn);
  return out;
}

expected<token_rewards_result> token_level_rewards(const at::Tensor& scores,
                                                   const at::Tensor& log_probs,
                                                   const at::Tensor& ref_log_probs,
                                                   const at::Tensor& mask, double beta,
                                                   kl_estimator est) {
  constexpr std::string_view fn = "token_level_rewards";
  if (auto err =
          check_tokens2d(fn, {"log_probs", "ref_log_probs"}, {&log_probs, &ref_log_probs}, mask))
    return err;
  if (auto err = detail::first_error({detail::require_dim(fn, "scores", scores, 1, "[B]"),
                                      detail::require_range(fn, "beta", beta, 0.0, kInf)}))
    return err;
  if (auto err = detail::first_error(
          {detail::require_floating(fn, "scores", scores),
           detail::require_same_device(fn, "scores", scores, "log_probs", log_probs)}))
    return err;
  if (scores.size(0) != log_probs.size(0))
    return make_error(errc::shape_mismatch,
                      detail::cat(fn, ": scores has shape ", detail::shape_str(scores),
                                  ", expected [", std::to_string(log_probs.size(0)),
                                  "] (one per row of log_probs ", detail::shape_str(log_probs),
                                  ")"));
  return guarded(fn, [&] {
    at::NoGradGuard no_grad;
    auto type = detail::compute_type({scores, log_probs, ref_log_probs});
    auto valid = detail::as_bool_mask(mask);
    auto zero = at::zeros({}, log_probs.options().dtype(type));
    auto kl = unwrap(kl_penalty(log_probs.detach().to(type), ref_log_probs.detach().to(type), est));
    kl = at::where(valid, kl, zero);
    auto rewards = -beta * kl;
    // Last valid position of each row; rows without one get nothing.
    auto steps = at::arange(valid.size(1), valid.options().dtype(at::kLong));
    auto last = at::where(valid, steps, at::full({}, -1, steps.options())).amax(1);
    auto has_any = last.ge(0);
    auto score = at::where(has_any, scores.detach().to(type), zero);
    rewards.scatter_add_(1, last.clamp_min(0).unsqueeze(1), score.unsqueeze(1));
    return token_rewards_result{rewards, kl};
  });
}

} // namespace troupe::kernels
