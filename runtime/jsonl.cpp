#include "runtime/jsonl.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace troupe::runtime {

expected<int64_t>
read_jsonl(const std::string& path,
           const std::function<expected<void>(const nlohmann::json&)>& on_record) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return make_error(errc::io_error, "cannot open " + path + ": " + std::strerror(errno));
  std::string line;
  int64_t line_no = 0;
  int64_t records = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r')
      line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos)
      continue;
    auto where = path + ":" + std::to_string(line_no);
    if (auto at = json_too_deep_at(line); at != std::string_view::npos)
      return json_too_deep(where, at);
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded())
      return make_error(errc::parse_error, where + ": not valid JSON");
    if (!j.is_object())
      return make_error(errc::parse_error,
                        where + ": expected a JSON object, got " + std::string{j.type_name()});
    if (auto ok = on_record(j); !ok)
      return with_prefix(ok.error(), where);
    ++records;
  }
  if (in.bad())
    return make_error(errc::io_error, "cannot read " + path + ": " + std::strerror(errno));
  return records;
}

const char* json_type_name(const nlohmann::json& j) {
  if (j.is_number_integer())
    return "integer";
  if (j.is_number_float())
    return "number";
  return j.type_name();
}

std::string base64(std::string_view bytes) {
  static constexpr char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  auto byte = [&](size_t i) { return static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])); };
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    uint32_t v = byte(i) << 16 | byte(i + 1) << 8 | byte(i + 2);
    for (int k = 18; k >= 0; k -= 6)
      out += abc[(v >> k) & 63];
  }
  if (i < bytes.size()) {
    bool two = i + 1 < bytes.size();
    uint32_t v = byte(i) << 16 | (two ? byte(i + 1) << 8 : 0);
    out += abc[(v >> 18) & 63];
    out += abc[(v >> 12) & 63];
    out += two ? abc[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

namespace {

// Walks the brackets of JSON text from `start` (strings skipped), calling
// `at(i, depth)` after each one changes the nesting depth; returns the first
// i for which it answers true, or npos.
template <class F>
size_t scan_brackets(std::string_view text, size_t start, F&& at) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = start; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (at(i, ++depth))
        return i;
    } else if (c == ']' || c == '}') {
      if (at(i, --depth))
        return i;
    }
  }
  return std::string_view::npos;
}

} // namespace

size_t json_too_deep_at(std::string_view text, int max_depth) {
  return scan_brackets(text, 0, [&](size_t, int depth) { return depth > max_depth; });
}

size_t json_container_end(std::string_view text, size_t start) {
  if (start >= text.size() || (text[start] != '{' && text[start] != '['))
    return std::string_view::npos;
  auto close = scan_brackets(text, start, [](size_t, int depth) { return depth == 0; });
  return close == std::string_view::npos ? close : close + 1;
}

caf::error json_too_deep(const std::string& what, size_t at) {
  return make_error(errc::parse_error, what + ": JSON nests arrays and objects deeper than " +
                                           std::to_string(max_json_depth) +
                                           " levels (the limit), at byte " + std::to_string(at));
}

} // namespace troupe::runtime
