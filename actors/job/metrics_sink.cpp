#include "actors/job/metrics_sink.hpp"

#include "runtime/file_io.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>

namespace troupe::actors::job {

expected<std::shared_ptr<metrics_sink>> metrics_sink::open(std::string path,
                                                           std::vector<std::string> stage_order) {
  std::shared_ptr<metrics_sink> s{new metrics_sink};
  s->path_ = std::move(path);
  s->stages_ = std::move(stage_order);
  s->f_ = std::fopen(s->path_.c_str(), "a");
  if (!s->f_)
    return make_error(errc::io_error, "cannot open " + s->path_ + ": " + std::strerror(errno));
  return s;
}

metrics_sink::~metrics_sink() {
  if (f_)
    std::fclose(f_);
}

expected<void> metrics_sink::operator()(const event& e) {
  if (auto* m = std::get_if<metrics_reported>(&e.body))
    return write(*m);
  if (auto* s = std::get_if<stage_started>(&e.body))
    return truncate(s->stage, s->from_step == 0 ? -1 : s->from_step);
  return {};
}

expected<void> metrics_sink::truncate(const std::string& stage, int64_t keep_until) {
  auto text = runtime::read_file(path_);
  if (!text)
    return text.error();
  auto pos = std::find(stages_.begin(), stages_.end(), stage);
  std::string kept;
  size_t start = 0;
  bool dropped = false;
  while (start < text->size()) {
    auto end = text->find('\n', start);
    if (end == std::string::npos)
      end = text->size(); // a torn last line
    auto line = text->substr(start, end - start);
    bool complete = end < text->size();
    start = end + 1;
    auto j = nlohmann::json::parse(line, nullptr, false);
    bool keep = complete && j.is_object() && j.contains("stage") && j["stage"].is_string() &&
                j.contains("step") && j["step"].is_number_integer();
    if (keep) {
      auto s = j["stage"].get<std::string>();
      auto it = std::find(stages_.begin(), stages_.end(), s);
      if (it > pos || (s == stage && j["step"].get<int64_t>() > keep_until))
        keep = false;
    }
    if (keep)
      kept += line + "\n";
    else
      dropped = true;
  }
  if (!dropped)
    return {};
  std::fclose(f_);
  f_ = nullptr;
  if (auto ok = runtime::write_file_atomic(path_, kept); !ok)
    return ok;
  f_ = std::fopen(path_.c_str(), "a");
  if (!f_)
    return make_error(errc::io_error, "cannot open " + path_ + ": " + std::strerror(errno));
  return {};
}

expected<void> metrics_sink::write(const metrics_reported& m) {
  if (!f_)
    return make_error(errc::io_error, path_ + " is not open");
  nlohmann::json j = nlohmann::json::object();
  j["stage"] = m.stage;
  j["step"] = m.step;
  for (const auto& [k, v] : m.metrics)
    j[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
  auto line = j.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    return make_error(errc::io_error, "cannot write " + path_ + ": " + std::strerror(errno));
  return {};
}

} // namespace troupe::actors::job
