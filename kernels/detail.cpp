#include "kernels/detail.hpp"

#include <torch/torch.h>

#include <cmath>
#include <sstream>

namespace troupe::kernels::detail {

namespace {

std::string prefix(std::string_view fn, std::string_view name) {
  std::string out{fn};
  out += ": ";
  out += name;
  return out;
}

std::string number_str(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

} // namespace

std::string shape_str(const at::Tensor& t) {
  if (!t.defined())
    return "undefined";
  std::string out = "[";
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (i > 0)
      out += ", ";
    out += std::to_string(t.size(i));
  }
  out += "]";
  return out;
}

caf::error require_defined(std::string_view fn, std::string_view name, const at::Tensor& t) {
  if (t.defined())
    return {};
  return make_error(errc::invalid_argument, prefix(fn, name) + " is undefined");
}

caf::error require_dim(std::string_view fn, std::string_view name, const at::Tensor& t, int64_t dim,
                       std::string_view layout) {
  if (auto err = require_defined(fn, name, t))
    return err;
  if (t.dim() == dim)
    return {};
  return make_error(errc::shape_mismatch, prefix(fn, name) + " has shape " + shape_str(t) +
                                              ", expected " + std::to_string(dim) + " dimensions " +
                                              std::string{layout});
}

caf::error require_same_shape(std::string_view fn, std::string_view name, const at::Tensor& t,
                              std::string_view ref_name, const at::Tensor& ref) {
  if (auto err = require_defined(fn, name, t))
    return err;
  if (!ref.defined() || t.sizes() == ref.sizes())
    return {};
  return make_error(errc::shape_mismatch, prefix(fn, name) + " has shape " + shape_str(t) +
                                              ", expected " + shape_str(ref) + " like " +
                                              std::string{ref_name});
}

caf::error require_floating(std::string_view fn, std::string_view name, const at::Tensor& t) {
  if (auto err = require_defined(fn, name, t))
    return err;
  if (at::isFloatingType(t.scalar_type()))
    return {};
  return make_error(errc::shape_mismatch, prefix(fn, name) + " has dtype " +
                                              std::string{c10::toString(t.scalar_type())} +
                                              ", expected a floating-point dtype");
}

caf::error require_integral(std::string_view fn, std::string_view name, const at::Tensor& t) {
  if (auto err = require_defined(fn, name, t))
    return err;
  if (at::isIntegralType(t.scalar_type(), /*includeBool=*/false))
    return {};
  return make_error(errc::shape_mismatch, prefix(fn, name) + " has dtype " +
                                              std::string{c10::toString(t.scalar_type())} +
                                              ", expected an integer dtype (token ids)");
}

caf::error require_mask(std::string_view fn, std::string_view name, const at::Tensor& t) {
  if (auto err = require_defined(fn, name, t))
    return err;
  auto type = t.scalar_type();
  if (type == at::kBool || at::isIntegralType(type, false) || at::isFloatingType(type))
    return {};
  return make_error(errc::shape_mismatch, prefix(fn, name) + " has dtype " +
                                              std::string{c10::toString(type)} +
                                              ", expected bool, integer or floating (0/1)");
}

caf::error require_same_device(std::string_view fn, std::string_view name, const at::Tensor& t,
                               std::string_view ref_name, const at::Tensor& ref) {
  if (!t.defined() || !ref.defined() || t.device() == ref.device())
    return {};
  return make_error(errc::invalid_argument, prefix(fn, name) + " is on " + t.device().str() +
                                                ", expected " + ref.device().str() + " like " +
                                                std::string{ref_name});
}

caf::error require_range(std::string_view fn, std::string_view name, double x, double lo, double hi,
                         bool lo_inclusive, bool hi_inclusive) {
  bool ok =
      std::isfinite(x) && (lo_inclusive ? x >= lo : x > lo) && (hi_inclusive ? x <= hi : x < hi);
  if (ok)
    return {};
  std::string range = std::string{lo_inclusive ? "[" : "("} + number_str(lo) + ", " +
                      (std::isinf(hi) ? std::string{"inf"} : number_str(hi)) +
                      (hi_inclusive && !std::isinf(hi) ? "]" : ")");
  return make_error(errc::invalid_argument,
                    prefix(fn, name) + " must be in " + range + ", got " + number_str(x));
}

at::ScalarType compute_type(std::initializer_list<at::Tensor> inputs) {
  for (const auto& t : inputs)
    if (t.defined() && t.scalar_type() == at::kDouble)
      return at::kDouble;
  return at::kFloat;
}

at::Tensor as_bool_mask(const at::Tensor& mask) {
  return mask.scalar_type() == at::kBool ? mask : mask.ne(0);
}

caf::error unsupported_device(std::string_view fn, std::string_view name, const at::Tensor& t) {
  return make_error(errc::unsupported,
                    prefix(fn, name) + " is on " + t.device().str() +
                        ", but this build has no kernel for that device (CUDA tensors need "
                        "nvcc and a CUDA-enabled LibTorch at build time)");
}

} // namespace troupe::kernels::detail
