#include "runtime/jsonl.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace troupe::runtime {

expected<int64_t> read_jsonl(const std::string& path,
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
      return make_error(errc::parse_error, where + ": expected a JSON object, got " +
                                             std::string{j.type_name()});
    if (auto ok = on_record(j); !ok)
      return with_prefix(ok.error(), where);
    ++records;
  }
  if (in.bad())
    return make_error(errc::io_error, "cannot read " + path + ": " + std::strerror(errno));
  return records;
}

} // namespace troupe::runtime
