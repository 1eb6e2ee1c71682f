#pragma once
// Helpers shared by the kernels unit and GPU tests.

#include "runtime/error.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <initializer_list>
#include <string>
#include <vector>

namespace troupe::kernels::testing {

/// A 1-D tensor of `values` in `type` (fp32 unless given).
inline at::Tensor vec(std::vector<double> values, at::ScalarType type = at::kFloat) {
  return torch::tensor(values, torch::kDouble).to(type);
}

/// A 2-D tensor from rows of equal length.
inline at::Tensor mat(std::initializer_list<std::vector<double>> rows,
                      at::ScalarType type = at::kFloat) {
  std::vector<at::Tensor> ts;
  for (const auto& r : rows)
    ts.push_back(vec(r, type));
  return torch::stack(ts);
}

/// The value of `x`, failing the test (with the error text) when it holds an error.
template <class T>
T value_of(expected<T> x) {
  if (!x) {
    ADD_FAILURE() << "unexpected error: " << describe(x.error());
    return T{};
  }
  return std::move(*x);
}

/// Expects every element of `actual` within `tol` of `want` (same number of elements).
inline void expect_close(const at::Tensor& actual, const at::Tensor& want, double tol,
                         const std::string& what = "") {
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_EQ(actual.numel(), want.numel()) << what;
  auto a = actual.detach().to(torch::kDouble).cpu().reshape({-1});
  auto w = want.detach().to(torch::kDouble).cpu().reshape({-1});
  auto pa = a.accessor<double, 1>();
  auto pw = w.accessor<double, 1>();
  for (int64_t i = 0; i < a.numel(); ++i)
    EXPECT_NEAR(pa[i], pw[i], tol) << what << " at flat index " << i;
}

/// Expects every element of `actual` within `tol` of `want`.
inline void expect_close(const at::Tensor& actual, std::vector<double> want, double tol,
                         const std::string& what = "") {
  expect_close(actual, vec(want, at::kDouble), tol, what);
}

/// Scalar value of a 0-dim or 1-element tensor.
inline double scalar(const at::Tensor& t) {
  return t.detach().to(torch::kDouble).cpu().item<double>();
}

/// Expects `x` to hold an error with code `code` whose context contains `needle`.
template <class T>
void expect_error(const expected<T>& x, errc code, const std::string& needle = "") {
  ASSERT_FALSE(static_cast<bool>(x)) << "expected an error " << to_string(code);
  EXPECT_EQ(code_of(x.error()), code) << describe(x.error());
  if (!needle.empty()) {
    EXPECT_NE(context_of(x.error()).find(needle), std::string::npos)
        << "context \"" << context_of(x.error()) << "\" lacks \"" << needle << "\"";
  }
}

} // namespace troupe::kernels::testing
