#pragma once
// Reading tokenizer.json components with their JSON paths (internal to the
// tokenizer sources). Parsers throw `json_failure`, which hf_tokenizer's
// loader turns into an error value: no exception leaves models/.

#include "runtime/error.hpp"

#include <nlohmann/json.hpp>

#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::models::tok {

using json = nlohmann::json;

/// A refused tokenizer.json: the error code and "path: what".
struct json_failure {
  errc code;
  std::string message;
};

/// A JSON value and where it is ("pre_tokenizer.pretokenizers[1]").
struct json_at {
  const json& value;
  std::string path;

  /// The member `key` (which must exist unless `optional`), or nullopt.
  std::optional<json_at> get(const char* key, bool optional = false) const;
  /// The element `i` of an array.
  json_at at(size_t i) const;

  /// The value as a type, or a parse failure naming the path.
  const json& object() const;
  const json& array() const;
  std::string string() const;
  bool boolean() const;
  int64_t integer(int64_t min, int64_t max) const;

  /// Member readers with defaults for absent or null members.
  bool flag(const char* key, bool fallback) const;
  std::string text(const char* key, const std::string& fallback) const;
  std::optional<std::string> optional_text(const char* key) const;

  /// The component's "type" string.
  std::string type() const;

  /// Throws a parse failure at this path: "path: what".
  [[noreturn]] void fail(const std::string& what, errc code = errc::parse_error) const;
  /// Throws "path.type: '<type>' is not supported (supported: ...)".
  [[noreturn]] void unsupported_type(std::string_view kind,
                                     std::initializer_list<std::string_view> supported) const;
};

/// The components of the array member `key` of `j`, each read by `parse`
/// (which may answer nullptr for a null entry, left out).
template <class T, class Parse>
std::vector<std::unique_ptr<T>> parse_list(const json_at& j, const char* key, Parse&& parse) {
  auto list = *j.get(key);
  std::vector<std::unique_ptr<T>> out;
  for (size_t i = 0; i < list.array().size(); ++i)
    if (auto c = parse(list.at(i)))
      out.push_back(std::move(c));
  return out;
}

} // namespace troupe::models::tok
