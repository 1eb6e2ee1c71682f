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
  } catch (const c10::Error& e) {
    return fail(errc::internal, e.what_without_backtrace());
  } catch (const std::bad_alloc&) {
    return fail(errc::unavailable, "out of memory");
  } catch (const std::exception& e) {
    return fail(errc::internal, e.what());
  }
}

} // namespace troupe
