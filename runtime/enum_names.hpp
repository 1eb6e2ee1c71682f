#pragma once
// One name table per enum (STYLE.md: "a choice is an enum from the file to
// the kernel").
//
// NOTE [enum names]: an enum whose values are 0, 1, ... declares its names
// once, beside it, in value order:
//
//   enum class kl_estimator : uint8_t { k1, abs, k2, k3 };
//   TROUPE_ENUM_NAMES(kl_estimator, "k1", "abs", "k2", "k3")
//   TROUPE_ENUM_ALIASES(kl_estimator, {"kl", kl_estimator::k1})   // optional
//
// The macro defines, in the enum's namespace (found by ADL), `enum_names(E)`
// and `to_string(E)`. Everything else reads that table: enum_from_name
// (names, then aliases), the config visitors' choice() for enum fields
// (loading, the reference file's "(a, b, c)" lists, `--set`), error messages
// listing the values, and the tests that round-trip every value. In CAF
// messages an enum travels as its underlying integer (CAF's default for
// enums), so it needs no inspect of its own.

#include <algorithm>
#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace troupe {

/// An enum with a TROUPE_ENUM_NAMES table.
template <class E>
concept named_enum = std::is_enum_v<E> && requires(E e) {
  enum_names(e);
};

/// An enum with a TROUPE_ENUM_ALIASES table as well.
template <class E>
concept aliased_enum = named_enum<E> && requires(E e) {
  enum_aliases(e);
};

/// The number of values of `E`.
template <named_enum E>
constexpr size_t enum_count() noexcept {
  return enum_names(E{}).size();
}

/// The name of `e` ("?" for a value outside the table).
template <named_enum E>
constexpr std::string_view enum_name(E e) noexcept {
  constexpr auto names = enum_names(E{});
  auto i = static_cast<size_t>(e);
  return i < names.size() ? names[i] : std::string_view{"?"};
}

/// The value named `name` (or aliased so), if any.
template <named_enum E>
constexpr std::optional<E> enum_from_name(std::string_view name) noexcept {
  constexpr auto names = enum_names(E{});
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name)
      return static_cast<E>(i);
  if constexpr (aliased_enum<E>) {
    for (const auto& [alias, value] : enum_aliases(E{}))
      if (alias == name)
        return value;
  }
  return std::nullopt;
}

/// Every name a file may use: the names in value order, then the aliases.
template <named_enum E>
std::vector<std::string_view> enum_choices() {
  constexpr auto names = enum_names(E{});
  std::vector<std::string_view> out(names.begin(), names.end());
  if constexpr (aliased_enum<E>) {
    for (const auto& [alias, value] : enum_aliases(E{}))
      out.push_back(alias);
  }
  return out;
}

/// The names joined for messages: "a, b, c".
template <named_enum E>
std::string enum_name_list() {
  std::string out;
  for (auto n : enum_names(E{}))
    out.append(out.empty() ? "" : ", ").append(n);
  return out;
}

} // namespace troupe

/// Declares the names of enum `E` in value order (NOTE [enum names]); use in
/// E's namespace.
#define TROUPE_ENUM_NAMES(E, ...)                                                                  \
  [[maybe_unused]] constexpr auto enum_names(E) noexcept {                                         \
    return std::to_array<std::string_view>({__VA_ARGS__});                                         \
  }                                                                                                \
  [[maybe_unused]] constexpr std::string_view to_string(E e) noexcept {                            \
    return ::troupe::enum_name(e);                                                                 \
  }

/// Other names a file may use for some values: {"alias", E::value}, ...
#define TROUPE_ENUM_ALIASES(E, ...)                                                                \
  [[maybe_unused]] constexpr auto enum_aliases(E) noexcept {                                       \
    return std::to_array<std::pair<std::string_view, E>>({__VA_ARGS__});                           \
  }
