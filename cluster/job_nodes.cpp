#include "cluster/job_nodes.hpp"

#include "cluster/credentials.hpp"
#include "runtime/file_io.hpp"

#include <nlohmann/json.hpp>

#include <filesystem>

namespace troupe::cluster {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string path_of(const std::string& job_dir, const char* file) {
  return (fs::path{job_dir} / file).string();
}

expected<json> read_json(const std::string& path) {
  auto text = runtime::read_file(path);
  if (!text)
    return text.error();
  auto j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return make_error(errc::parse_error, path + ": not a JSON object");
  return j;
}

// Field `key` of `j` as T, or an error naming the file and the field.
template <class T>
expected<T> field(const json& j, const char* key, const std::string& where) {
  auto it = j.find(key);
  bool ok = it != j.end() && (std::is_same_v<T, std::string> ? it->is_string() : it->is_number_integer());
  if (!ok)
    return make_error(errc::parse_error, where + ": '" + key + "' is missing or of the wrong type");
  return it->get<T>();
}

// Letters, digits, '.', '_', '-' and `extra`; never a leading '-' (an
// argv element that could read as a flag).
bool harmless(std::string_view s, std::string_view extra, size_t max) {
  if (s.empty() || s.size() > max || s.front() == '-')
    return false;
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-' &&
        extra.find(c) == std::string_view::npos)
      return false;
  return true;
}

} // namespace

bool valid_job_id(std::string_view id) {
  return harmless(id, "", 64);
}

expected<void> write_job_nodes(const std::string& job_dir, const job_nodes& n) {
  json nodes = json::array();
  for (const auto& x : n.nodes)
    nodes.push_back({{"name", x.name}, {"host", x.host}});
  return runtime::write_file_atomic(path_of(job_dir, nodes_file),
                                    json{{"bind", n.bind_host}, {"nodes", nodes}}.dump(2));
}

expected<job_nodes> read_job_nodes(const std::string& job_dir) {
  auto path = path_of(job_dir, nodes_file);
  auto j = read_json(path);
  if (!j)
    return j.error();
  job_nodes out;
  auto bind = field<std::string>(*j, "bind", path);
  if (!bind)
    return bind.error();
  out.bind_host = *bind;
  auto it = j->find("nodes");
  if (it == j->end() || !it->is_array() || it->empty())
    return make_error(errc::parse_error, path + ": 'nodes' must be a list of at least one node");
  for (size_t i = 0; i < it->size(); ++i) {
    auto where = path + ": nodes[" + std::to_string(i) + "]";
    const auto& x = (*it)[i];
    if (!x.is_object())
      return make_error(errc::parse_error, where + ": not an object");
    auto name = field<std::string>(x, "name", where);
    auto host = field<std::string>(x, "host", where);
    if (!name)
      return name.error();
    if (!host)
      return host.error();
    out.nodes.push_back({*name, *host});
  }
  return out;
}

expected<void> check_worker_requests(const worker_request_file& w) {
  for (size_t i = 0; i < w.workers.size(); ++i)
    if (w.workers[i].rank != static_cast<int32_t>(i))
      return make_error(errc::invalid_argument, "workers[" + std::to_string(i) + "]: rank " +
                                                    std::to_string(w.workers[i].rank) + " out of order");
  return {};
}

expected<void> check_worker_start(const worker_start& s) {
  auto bad = [](const std::string& field, const std::string& why) {
    return make_error(errc::invalid_argument, "StartWorker." + field + ": " + why);
  };
  if (!valid_job_id(s.job_id))
    return bad("job_id", "expected [A-Za-z0-9._-]{1,64}, not starting with '-'");
  if (s.world < 1 || s.world > 4096)
    return bad("world", std::to_string(s.world) + " outside 1..4096");
  if (s.rank < 0 || s.rank >= s.world)
    return bad("rank", std::to_string(s.rank) + " outside 0.." + std::to_string(s.world - 1));
  if (!harmless(s.label, ":+[]", 200))
    return bad("label", "expected [A-Za-z0-9._:+[]-]{1,200}, not starting with '-'");
  auto addr = parse_listen_address(s.driver);
  if (!addr || addr->second < 1 || !harmless(addr->first, ":", 253))
    return bad("driver", "expected HOST:PORT, got '" + s.driver.substr(0, 80) + "'");
  if (s.cwd.empty() || s.cwd.front() != '/' || s.cwd.size() > 4096 ||
      s.cwd.find('\0') != std::string::npos)
    return bad("cwd", "expected an absolute path");
  if (s.timeout_ms < 1 || s.timeout_ms > 24LL * 3600 * 1000)
    return bad("timeout_ms", std::to_string(s.timeout_ms) + " outside 1 ms .. 24 h");
  return {};
}

std::vector<std::string> worker_argv(const std::string& executable, const worker_start& s) {
  return {executable, "worker",  "--driver", s.driver, "--rank", std::to_string(s.rank),
          "--world",  std::to_string(s.world), "--role", s.label, "--timeout-ms",
          std::to_string(s.timeout_ms)};
}

} // namespace troupe::cluster
