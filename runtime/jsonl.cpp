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

} // namespace troupe::runtime
