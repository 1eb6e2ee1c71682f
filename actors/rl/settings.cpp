#include "actors/rl/settings.hpp"

#include "runtime/file_io.hpp"
#include "runtime/jsonl.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <variant>

namespace troupe::actors::rl {

namespace {

using field_ref = std::variant<const double*, const int64_t*>;

// The one table of runtime settings: key → the field it changes.
struct setting_entry {
  std::string key;
  field_ref (*field)(const job_config&);
};

const std::vector<setting_entry>& table() {
  static const std::vector<setting_entry> t{
      {"rl.kl.coef", [](const job_config& c) { return field_ref{&c.rl.kl.coef}; }},
      {"rl.generation.temperature",
       [](const job_config& c) { return field_ref{&c.rl.generation.temperature}; }},
      {"rl.generation.top_p",
       [](const job_config& c) { return field_ref{&c.rl.generation.top_p}; }},
      {"rl.generation.max_tokens",
       [](const job_config& c) { return field_ref{&c.rl.generation.max_tokens}; }},
      {"rl.eval_every", [](const job_config& c) { return field_ref{&c.rl.eval_every}; }},
      {"rl.checkpoint_every",
       [](const job_config& c) { return field_ref{&c.rl.checkpoint_every}; }},
      {"rl.actor_optim.lr", [](const job_config& c) { return field_ref{&c.rl.actor_optim.lr}; }},
  };
  return t;
}

const setting_entry* find_setting(const std::string& key) {
  for (const auto& e : table())
    if (e.key == key)
      return &e;
  return nullptr;
}

} // namespace

const std::vector<std::string>& runtime_settings() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> out;
    for (const auto& e : table())
      out.push_back(e.key);
    return out;
  }();
  return keys;
}

std::string setting_value(const job_config& c, const std::string& key) {
  const auto* entry = find_setting(key);
  if (!entry)
    return {};
  auto f = entry->field(c);
  if (auto* d = std::get_if<const double*>(&f)) {
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, **d); // shortest form that reads back
    return std::string{buf, r.ptr};
  }
  return std::to_string(*std::get<const int64_t*>(f));
}

expected<job_config> with_setting(const job_config& c, const std::string& key,
                                  const std::string& value) {
  if (!find_setting(key)) {
    std::string list;
    for (const auto& k : runtime_settings())
      list += (list.empty() ? "" : ", ") + k;
    return make_error(errc::invalid_argument,
                      key + ": not a runtime setting (a running job accepts " + list + ")");
  }
  if (key == "rl.kl.coef" && c.rl.kl.coef == 0)
    return make_error(errc::invalid_argument,
                      key + ": the job started without a reference (rl.kl.coef 0); a KL "
                            "coefficient needs one from the start");
  auto doc = runtime::yaml_document::from_text(runtime::to_yaml(c, false), "the running job");
  if (!doc)
    return doc.error();
  if (auto ok = doc->set(key + "=" + value); !ok)
    return ok.error();
  auto next = runtime::load_config<job_config>(*doc);
  if (!next)
    return next.error();
  if (key == "rl.kl.coef" && next->rl.kl.coef <= 0)
    return make_error(errc::invalid_argument,
                      key + ": must stay above 0 in a job that has a reference");
  return next;
}

expected<std::string> settings_book::accept(const std::string& key, const std::string& value) {
  std::lock_guard lock{mu_};
  auto next = with_setting(latest_, key, value);
  if (!next)
    return next.error();
  latest_ = std::move(*next);
  return setting_value(latest_, key);
}

expected<std::vector<recorded_setting>> read_settings(const std::string& path) {
  std::vector<recorded_setting> out;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    return out;
  auto text = runtime::read_file(path);
  if (!text)
    return text.error();
  std::istringstream in{*text};
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (in.eof())
      break; // no newline: a torn last line
    auto j = runtime::json_too_deep_at(line) == std::string_view::npos
                 ? nlohmann::json::parse(line, nullptr, false)
                 : nlohmann::json(nlohmann::json::value_t::discarded);
    if (j.is_discarded() || !j.is_object() || !j.contains("iteration") ||
        !j["iteration"].is_number_integer() || !j.contains("key") || !j["key"].is_string() ||
        !j.contains("value") || !j["value"].is_string())
      return make_error(errc::corrupted, path + ":" + std::to_string(n) +
                                             ": expected {\"iteration\", \"key\", \"value\"}");
    out.push_back({j["iteration"].get<int64_t>(), j["key"].get<std::string>(),
                   j["value"].get<std::string>()});
  }
  return out;
}

expected<void> append_setting(const std::string& path, const recorded_setting& s) {
  auto line =
      nlohmann::json{{"iteration", s.iteration}, {"key", s.key}, {"value", s.value}}.dump() + "\n";
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f)
    return make_error(errc::io_error, "cannot open " + path + ": " + std::strerror(errno));
  bool ok = std::fwrite(line.data(), 1, line.size(), f) == line.size() && std::fflush(f) == 0;
  std::fclose(f);
  if (!ok)
    return make_error(errc::io_error, "cannot write " + path);
  return {};
}

} // namespace troupe::actors::rl
