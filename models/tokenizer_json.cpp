#include "models/tokenizer_json.hpp"

#include "runtime/jsonl.hpp"

namespace troupe::models::tok {

void json_at::fail(const std::string& what, errc code) const {
  throw json_failure{code, (path.empty() ? std::string{"(top level)"} : path) + ": " + what};
}

void json_at::unsupported_type(std::string_view kind,
                               std::initializer_list<std::string_view> supported) const {
  std::string list;
  for (auto s : supported)
    list += (list.empty() ? "" : ", ") + std::string{s};
  json_at{value, path + ".type"}.fail(std::string{kind} + " '" + type() +
                                          "' is not supported (supported: " + list + ")",
                                      errc::unsupported);
}

std::optional<json_at> json_at::get(const char* key, bool optional) const {
  object();
  auto it = value.find(key);
  auto where = path.empty() ? std::string{key} : path + "." + key;
  if (it == value.end()) {
    if (optional)
      return std::nullopt;
    json_at{value, path}.fail(std::string{"missing key '"} + key + "'");
  }
  return json_at{*it, where};
}

json_at json_at::at(size_t i) const {
  return json_at{array()[i], path + "[" + std::to_string(i) + "]"};
}

const json& json_at::object() const {
  if (!value.is_object())
    fail(std::string{"expected an object, got "} + runtime::json_type_name(value));
  return value;
}

const json& json_at::array() const {
  if (!value.is_array())
    fail(std::string{"expected an array, got "} + runtime::json_type_name(value));
  return value;
}

std::string json_at::string() const {
  if (!value.is_string())
    fail(std::string{"expected a string, got "} + runtime::json_type_name(value));
  return value.get<std::string>();
}

bool json_at::boolean() const {
  if (!value.is_boolean())
    fail(std::string{"expected a boolean, got "} + runtime::json_type_name(value));
  return value.get<bool>();
}

int64_t json_at::integer(int64_t min, int64_t max) const {
  bool ok = value.is_number_integer() &&
            !(value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(max));
  if (ok) {
    auto v = value.get<int64_t>();
    if (v >= min && v <= max)
      return v;
  }
  fail("expected an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "], got " +
       value.dump());
}

bool json_at::flag(const char* key, bool fallback) const {
  auto m = get(key, true);
  if (!m || m->value.is_null())
    return fallback;
  return m->boolean();
}

std::string json_at::text(const char* key, const std::string& fallback) const {
  auto m = get(key, true);
  if (!m || m->value.is_null())
    return fallback;
  return m->string();
}

std::optional<std::string> json_at::optional_text(const char* key) const {
  auto m = get(key, true);
  if (!m || m->value.is_null())
    return std::nullopt;
  return m->string();
}

std::string json_at::type() const {
  object();
  auto it = value.find("type");
  if (it == value.end() || !it->is_string())
    fail("expected an object with a string 'type'");
  return it->get<std::string>();
}

} // namespace troupe::models::tok
