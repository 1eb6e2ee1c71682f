#include "kernels/masked.hpp"

#include "kernels/detail.hpp"
#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

#include <limits>
#include <string>

namespace troupe::kernels {

namespace {

caf::error check_masked(std::string_view fn, const at::Tensor& x, const at::Tensor& mask) {
  return detail::first_error({detail::require_floating(fn, "x", x),
                              detail::require_mask(fn, "mask", mask),
                              detail::require_same_shape(fn, "mask", mask, "x", x),
                              detail::require_same_device(fn, "mask", mask, "x", x)});
}

caf::error check_dim(std::string_view fn, const at::Tensor& x, std::optional<int64_t> dim) {
  if (!dim)
    return {};
  int64_t d = x.dim();
  if (*dim >= -d && *dim < d && d > 0)
    return {};
  return make_error(errc::out_of_range, std::string{fn} + ": dim " + std::to_string(*dim) +
                                            " is out of range for x of shape " +
                                            detail::shape_str(x));
}

// Σ over valid elements and the valid count, both in x's dtype.
std::pair<at::Tensor, at::Tensor> sum_and_count(const at::Tensor& x, const at::Tensor& valid,
                                                std::optional<int64_t> dim) {
  auto zeroed = at::where(valid, x, at::zeros({}, x.options()));
  auto count = valid.to(x.scalar_type());
  if (dim)
    return {zeroed.sum(*dim), count.sum(*dim)};
  return {zeroed.sum(), count.sum()};
}

at::Tensor safe_divide(const at::Tensor& num, const at::Tensor& den) {
  auto positive = den.gt(0);
  return at::where(positive, num / at::where(positive, den, at::ones_like(den)),
                   at::zeros_like(num));
}

at::Tensor mean_impl(const at::Tensor& x, const at::Tensor& valid, std::optional<int64_t> dim) {
  auto [sum, count] = sum_and_count(x, valid, dim);
  return safe_divide(sum, count);
}

at::Tensor var_impl(const at::Tensor& x, const at::Tensor& valid, bool unbiased) {
  auto [sum, count] = sum_and_count(x, valid, std::nullopt);
  auto mean = safe_divide(sum, count);
  auto centered = at::where(valid, x - mean, at::zeros({}, x.options()));
  auto sq = centered.pow(2).sum();
  return safe_divide(sq, unbiased ? count - 1 : count);
}

} // namespace

expected<loss_agg_mode> parse_loss_agg_mode(std::string_view name) {
  if (auto m = enum_from_name<loss_agg_mode>(name))
    return *m;
  std::string names;
  for (auto n : enum_choices<loss_agg_mode>())
    names += (names.empty() ? "\"" : ", \"") + std::string{n} + "\"";
  return make_error(errc::invalid_argument, "loss aggregation mode: expected one of " + names +
                                                ", got \"" + std::string{name} + "\"");
}

expected<at::Tensor> masked_sum(const at::Tensor& x, const at::Tensor& mask,
                                std::optional<int64_t> dim) {
  constexpr std::string_view fn = "masked_sum";
  if (auto err = detail::first_error({check_masked(fn, x, mask), check_dim(fn, x, dim)}))
    return err;
  return guarded(fn, [&] { return sum_and_count(x, detail::as_bool_mask(mask), dim).first; });
}

expected<at::Tensor> masked_mean(const at::Tensor& x, const at::Tensor& mask,
                                 std::optional<int64_t> dim) {
  constexpr std::string_view fn = "masked_mean";
  if (auto err = detail::first_error({check_masked(fn, x, mask), check_dim(fn, x, dim)}))
    return err;
  return guarded(fn, [&] { return mean_impl(x, detail::as_bool_mask(mask), dim); });
}

expected<at::Tensor> masked_var(const at::Tensor& x, const at::Tensor& mask, bool unbiased) {
  constexpr std::string_view fn = "masked_var";
  if (auto err = check_masked(fn, x, mask))
    return err;
  return guarded(fn, [&] { return var_impl(x, detail::as_bool_mask(mask), unbiased); });
}

expected<at::Tensor> masked_whiten(const at::Tensor& x, const at::Tensor& mask,
                                   const whiten_options& opts) {
  constexpr std::string_view fn = "masked_whiten";
  if (auto err = detail::first_error(
          {check_masked(fn, x, mask), detail::require_range(fn, "eps", opts.eps, 0.0, 1.0)}))
    return err;
  return guarded(fn, [&] {
    auto valid = detail::as_bool_mask(mask);
    auto mean = mean_impl(x, valid, std::nullopt);
    auto var = var_impl(x, valid, /*unbiased=*/true);
    auto out = (x - mean) * at::rsqrt(var + opts.eps);
    if (!opts.shift_mean)
      out = out + mean;
    return at::where(valid, out, at::zeros({}, out.options()));
  });
}

expected<at::Tensor> aggregate_loss(const at::Tensor& loss, const at::Tensor& mask,
                                    loss_agg_mode mode, double scale_factor) {
  constexpr std::string_view fn = "aggregate_loss";
  if (auto err = detail::first_error(
          {detail::require_dim(fn, "loss", loss, 2, "[B, T]"), check_masked(fn, loss, mask),
           detail::require_range(fn, "scale_factor", scale_factor, 0.0,
                                 std::numeric_limits<double>::infinity())}))
    return err;
  return guarded(fn, [&] {
    auto valid = detail::as_bool_mask(mask);
    switch (mode) {
    case loss_agg_mode::token_mean:
      return mean_impl(loss, valid, std::nullopt);
    case loss_agg_mode::seq_mean_token_sum:
    case loss_agg_mode::seq_mean_token_mean: {
      auto per_seq = mode == loss_agg_mode::seq_mean_token_sum ? sum_and_count(loss, valid, 1).first
                                                               : mean_impl(loss, valid, 1);
      auto seq_valid = valid.any(1);
      return mean_impl(per_seq, seq_valid, std::nullopt);
    }
    case loss_agg_mode::token_sum:
      return sum_and_count(loss, valid, std::nullopt).first;
    case loss_agg_mode::seq_mean_token_sum_norm: {
      const double divisor = scale_factor > 0 ? scale_factor : static_cast<double>(loss.size(1));
      auto sum = sum_and_count(loss, valid, std::nullopt).first;
      return divisor > 0 ? sum / divisor : sum;
    }
    }
    return mean_impl(loss, valid, std::nullopt);
  });
}

} // namespace troupe::kernels
