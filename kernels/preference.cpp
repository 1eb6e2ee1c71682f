#include "kernels/preference.hpp"

#include "kernels/detail.hpp"
#include "kernels/masked.hpp"
#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

#include <limits>
#include <string>

namespace troupe::kernels {

expected<at::Tensor> sequence_log_probs(const at::Tensor& token_log_probs, const at::Tensor& mask,
                                        bool average) {
  constexpr std::string_view fn = "sequence_log_probs";
  if (auto err = detail::require_dim(fn, "token_log_probs", token_log_probs, 2, "[B, T]"))
    return err;
  auto out = average ? masked_mean(token_log_probs, mask, 1) : masked_sum(token_log_probs, mask, 1);
  if (!out)
    return with_prefix(out.error(), fn);
  return out;
}

expected<dpo_result> dpo_loss(const at::Tensor& chosen_log_probs,
                              const at::Tensor& rejected_log_probs,
                              const at::Tensor& ref_chosen_log_probs,
                              const at::Tensor& ref_rejected_log_probs, const dpo_options& opts) {
  constexpr std::string_view fn = "dpo_loss";
  if (auto err = detail::require_dim(fn, "chosen_log_probs", chosen_log_probs, 1, "[B]"))
    return err;
  for (auto [name, t] : {std::pair{"rejected_log_probs", &rejected_log_probs},
                         std::pair{"ref_chosen_log_probs", &ref_chosen_log_probs},
                         std::pair{"ref_rejected_log_probs", &ref_rejected_log_probs}})
    if (auto err = detail::first_error(
            {detail::require_floating(fn, name, *t),
             detail::require_same_shape(fn, name, *t, "chosen_log_probs", chosen_log_probs),
             detail::require_same_device(fn, name, *t, "chosen_log_probs", chosen_log_probs)}))
      return err;
  if (auto err = detail::first_error(
          {detail::require_floating(fn, "chosen_log_probs", chosen_log_probs),
           detail::require_range(fn, "beta", opts.beta, 0.0,
                                 std::numeric_limits<double>::infinity(), false, false),
           detail::require_range(fn, "label_smoothing", opts.label_smoothing, 0.0, 0.5, true,
                                 false)}))
    return err;
  if (opts.label_smoothing > 0 && opts.loss != dpo_loss_kind::sigmoid)
    return make_error(errc::invalid_argument,
                      detail::cat(fn, ": label_smoothing applies to the sigmoid loss only, not ",
                                  to_string(opts.loss)));
  return guarded(fn, [&] {
    auto ref_chosen = ref_chosen_log_probs.detach();
    auto ref_rejected = ref_rejected_log_probs.detach();
    auto h = (chosen_log_probs - rejected_log_probs) - (ref_chosen - ref_rejected);
    const double beta = opts.beta, eps = opts.label_smoothing;
    at::Tensor per_pair;
    switch (opts.loss) {
    case dpo_loss_kind::sigmoid:
      per_pair = -(1 - eps) * at::log_sigmoid(beta * h) - eps * at::log_sigmoid(-beta * h);
      break;
    case dpo_loss_kind::hinge:
      per_pair = at::relu(1 - beta * h);
      break;
    case dpo_loss_kind::ipo:
      per_pair = (h - 1 / (2 * beta)).pow(2);
      break;
    }
    dpo_result out;
    out.loss = per_pair.mean();
    out.chosen_rewards = (beta * (chosen_log_probs - ref_chosen)).detach();
    out.rejected_rewards = (beta * (rejected_log_probs - ref_rejected)).detach();
    return out;
  });
}

} // namespace troupe::kernels
