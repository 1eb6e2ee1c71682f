#include "actors/job/metrics_sink.hpp"

#include "runtime/file_io.hpp"
#include "runtime/jsonl.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>

namespace troupe::actors::job {

namespace {

// The scanner of each_metrics_line: `"key":value` pairs of one flat object.
class line_scanner {
public:
  explicit line_scanner(std::string_view s) : s_(s) {}

  bool parse(metrics_reported& out) {
    if (!eat('{'))
      return false;
    bool stage = false, step = false;
    while (!eat('}')) {
      if (!out.metrics.empty() || stage || step)
        if (!eat(','))
          return false;
      std::string key;
      if (!string(key) || !eat(':'))
        return false;
      if (key == "stage") {
        if (!string(out.stage))
          return false;
        stage = true;
      } else {
        double v;
        if (!number(v))
          return false;
        if (key == "step")
          out.step = static_cast<int64_t>(v), step = v == std::floor(v);
        else
          out.metrics.emplace(std::move(key), v);
      }
    }
    return stage && step && at_ == s_.size();
  }

private:
  bool eat(char c) {
    if (at_ < s_.size() && s_[at_] == c)
      return ++at_, true;
    return false;
  }
  // Keys and the stage: the sink writes them without escapes (a line with
  // one is left to the slow path).
  bool string(std::string& out) {
    if (!eat('"'))
      return false;
    auto end = s_.find('"', at_);
    if (end == std::string_view::npos || s_.substr(at_, end - at_).find('\\') != std::string_view::npos)
      return false;
    out.assign(s_.substr(at_, end - at_));
    at_ = end + 1;
    return true;
  }
  bool number(double& v) {
    if (s_.compare(at_, 4, "null") == 0)
      return at_ += 4, v = std::nan(""), true;
    auto end = s_.find_first_of(",}", at_);
    if (end == std::string_view::npos || end == at_)
      return false;
    auto [stop, ec] = std::from_chars(s_.data() + at_, s_.data() + end, v);
    if (ec != std::errc{} || stop != s_.data() + end)
      return false;
    at_ = end;
    return true;
  }

  std::string_view s_;
  size_t at_ = 0;
};

// The slow path: any JSON object with "stage" and "step".
bool parse_json_line(std::string_view line, metrics_reported& out) {
  if (runtime::json_too_deep_at(line) != std::string_view::npos)
    return false;
  auto j = nlohmann::json::parse(line, nullptr, false);
  if (!j.is_object() || !j.contains("stage") || !j["stage"].is_string() || !j.contains("step") ||
      !j["step"].is_number_integer())
    return false;
  for (const auto& [k, v] : j.items()) {
    if (k == "stage")
      out.stage = v.get<std::string>();
    else if (k == "step")
      out.step = v.get<int64_t>();
    else if (v.is_number())
      out.metrics.emplace(k, v.get<double>());
    else if (v.is_null())
      out.metrics.emplace(k, std::nan(""));
  }
  return true;
}

} // namespace

size_t each_metrics_line(std::string_view text, const std::function<void(const metrics_reported&)>& fn) {
  size_t n = 0, start = 0;
  while (start < text.size()) {
    auto end = text.find('\n', start);
    if (end == std::string_view::npos)
      break; // a torn last line
    auto line = text.substr(start, end - start);
    start = end + 1;
    metrics_reported m;
    if (!line_scanner{line}.parse(m)) {
      m = {};
      if (!parse_json_line(line, m))
        continue;
    }
    fn(m);
    ++n;
  }
  return n;
}

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
    auto j = runtime::json_too_deep_at(line) == std::string::npos
                 ? nlohmann::json::parse(line, nullptr, false)
                 : nlohmann::json(nlohmann::json::value_t::discarded);
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
