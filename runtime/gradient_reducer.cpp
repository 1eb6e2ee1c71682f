#include "runtime/gradient_reducer.hpp"

#include "runtime/collectives.hpp"
#include "runtime/torch_guard.hpp"

#include <ATen/ATen.h>

#include <string>

namespace troupe::runtime {

namespace {

int64_t bytes_of(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

// Parameter indices per bucket, reverse order, closing on size or dtype.
std::vector<std::vector<size_t>> plan_buckets(const std::vector<at::Tensor>& params,
                                              int64_t bucket_bytes) {
  std::vector<std::vector<size_t>> out;
  int64_t filled = 0;
  for (size_t k = params.size(); k-- > 0;) {
    const auto& p = params[k];
    bool fits = !out.empty() && filled + bytes_of(p) <= bucket_bytes &&
                params[out.back().front()].scalar_type() == p.scalar_type();
    if (!fits) {
      out.emplace_back();
      filled = 0;
    }
    out.back().push_back(k);
    filled += bytes_of(p);
  }
  return out;
}

caf::error check_params(const std::vector<at::Tensor>& params, const char* what) {
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    auto where = std::string{what} + ": parameter " + std::to_string(i);
    if (!p.defined())
      return make_error(errc::invalid_argument, where + " is undefined");
    if (!at::isFloatingType(p.scalar_type()))
      return make_error(errc::invalid_argument, where + " is not floating point");
    if (p.is_sparse())
      return make_error(errc::unsupported, where + " is sparse");
    if (p.device() != params.front().device())
      return make_error(errc::invalid_argument, where + " is on " + p.device().str() +
                                                    ", parameter 0 on " +
                                                    params.front().device().str());
  }
  return {};
}

} // namespace

struct gradient_reducer::impl {
  std::vector<at::Tensor> params;
  process_group* group = nullptr;
  std::vector<std::vector<size_t>> buckets;
  std::vector<at::Tensor> flats; // one per bucket, kept between steps
};

gradient_reducer::gradient_reducer() = default;
gradient_reducer::~gradient_reducer() = default;
gradient_reducer::gradient_reducer(gradient_reducer&&) noexcept = default;
gradient_reducer& gradient_reducer::operator=(gradient_reducer&&) noexcept = default;

expected<gradient_reducer> gradient_reducer::make(std::vector<at::Tensor> params,
                                                  process_group& group, reducer_options options) {
  if (options.bucket_bytes < 1)
    return make_error(errc::invalid_argument, "gradient_reducer: bucket_bytes must be positive");
  if (auto err = check_params(params, "gradient_reducer"))
    return err;
  gradient_reducer r;
  r.impl_ = std::make_unique<impl>();
  r.impl_->group = &group;
  r.impl_->buckets = plan_buckets(params, options.bucket_bytes);
  for (const auto& b : r.impl_->buckets) {
    int64_t n = 0;
    for (auto i : b)
      n += params[i].numel();
    const auto& first = params[b.front()];
    auto flat = guarded("gradient_reducer: bucket buffer",
                        [&] { return at::empty({n}, first.options().requires_grad(false)); });
    if (!flat)
      return flat.error();
    r.impl_->flats.push_back(std::move(*flat));
  }
  r.impl_->params = std::move(params);
  return r;
}

const std::vector<std::vector<size_t>>& gradient_reducer::buckets() const {
  static const std::vector<std::vector<size_t>> none;
  return impl_ ? impl_->buckets : none;
}

expected<void> gradient_reducer::all_reduce(double scale) {
  if (!impl_)
    return make_error(errc::invalid_argument, "all_reduce on an empty gradient_reducer");
  auto& d = *impl_;
  for (size_t b = 0; b < d.buckets.size(); ++b) {
    auto& flat = d.flats[b];
    auto packed = guarded("gradient_reducer: pack bucket " + std::to_string(b), [&] {
      int64_t off = 0;
      for (auto i : d.buckets[b]) {
        auto& p = d.params[i];
        auto n = p.numel();
        if (!p.grad().defined())
          p.mutable_grad() = at::zeros_like(p);
        flat.narrow(0, off, n).copy_(p.grad().reshape({-1}));
        off += n;
      }
    });
    if (!packed)
      return packed.error();
    if (auto ok = d.group->all_reduce_sum(flat); !ok)
      return with_prefix(ok.error(), "gradient_reducer: bucket " + std::to_string(b));
    auto unpacked = guarded("gradient_reducer: unpack bucket " + std::to_string(b), [&] {
      if (scale != 1.0)
        flat.mul_(scale);
      int64_t off = 0;
      for (auto i : d.buckets[b]) {
        auto& p = d.params[i];
        auto n = p.numel();
        p.mutable_grad().copy_(flat.narrow(0, off, n).view(p.grad().sizes()));
        off += n;
      }
    });
    if (!unpacked)
      return unpacked.error();
  }
  return {};
}

expected<void> broadcast_parameters(std::vector<at::Tensor>& params, process_group& group,
                                    int root, int64_t bucket_bytes) {
  if (bucket_bytes < 1)
    return make_error(errc::invalid_argument, "broadcast_parameters: bucket_bytes must be positive");
  if (auto err = check_params(params, "broadcast_parameters"))
    return err;
  for (const auto& b : plan_buckets(params, bucket_bytes)) {
    auto flat = guarded("broadcast_parameters: pack", [&] {
      std::vector<at::Tensor> parts;
      for (auto i : b)
        parts.push_back(params[i].detach().reshape({-1}));
      return at::cat(parts);
    });
    if (!flat)
      return flat.error();
    if (auto ok = group.broadcast(*flat, root); !ok)
      return with_prefix(ok.error(), "broadcast_parameters");
    auto unpacked = guarded("broadcast_parameters: unpack", [&] {
      int64_t off = 0;
      for (auto i : b) {
        auto& p = params[i];
        auto n = p.numel();
        p.detach().copy_(flat->narrow(0, off, n).view(p.sizes()));
        off += n;
      }
    });
    if (!unpacked)
      return unpacked.error();
  }
  return {};
}

} // namespace troupe::runtime
