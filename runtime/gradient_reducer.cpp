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
