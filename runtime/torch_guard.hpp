#pragma once
// Converts LibTorch exceptions into troupe errors at the call site, so that no
// c10::Error crosses a folder boundary (ARCHITECTURE.md, rule 1).

#include "runtime/error.hpp"

#include <c10/util/Exception.h>

#include <exception>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace troupe {

/// An error thrown through code that runs under guarded() (value_or_throw);
/// guarded() returns it as it was, prefixed, keeping its code.
struct error_exception : std::exception {
  explicit error_exception(caf::error e) : err(std::move(e)) {}
  const char* what() const noexcept override { return "troupe error"; }
  caf::error err;
};

/// The value of `r`, or throws its error as error_exception: for long chains
/// of fallible calls inside one guarded() block.
template <class T>
T value_or_throw(expected<T> r) {
  if (!r)
    throw error_exception(std::move(r.error()));
  return std::move(*r);
}
inline void value_or_throw(expected<void> r) {
  if (!r)
    throw error_exception(std::move(r.error()));
}

namespace detail {
template <class T>
struct is_expected : std::false_type {};
template <class T>
struct is_expected<caf::expected<T>> : std::true_type {};
} // namespace detail

/// Runs `f()`; returns its result, or an error whose context is
/// "<what>: <exception message>". `f` may itself return `expected<T>`.
template <class F>
auto guarded(std::string_view what, F&& f) {
  using result = std::invoke_result_t<F>;
  using out_t = std::conditional_t<detail::is_expected<result>::value, result,
                                   expected<result>>;
  auto fail = [&](errc code, const char* msg) -> out_t {
    return make_error(code, std::string{what} + ": " + msg);
  };
  try {
    if constexpr (std::is_void_v<result>) {
      std::forward<F>(f)();
      return out_t{caf::unit};
    } else {
      return out_t{std::forward<F>(f)()};
    }
  } catch (const error_exception& e) {
    return out_t{with_prefix(e.err, what)};
  } catch (const c10::Error& e) {
    return fail(errc::internal, e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    return fail(errc::unavailable, "out of memory");
  } catch (const std::exception& e) {
    return fail(errc::internal, e.what());
  }
}

} // namespace troupe
