#pragma once
// A job-scoped logger (spdlog stays in logging.cpp): each line goes to a file
// (`<run dir>/troupe.log`) and to a tee (the job's event stream), both behind
// one level filter taken from the config (run.log_level).

#include "runtime/enum_names.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace troupe::runtime {

enum class log_level : uint8_t { trace, debug, info, warn, error };
TROUPE_ENUM_NAMES(log_level, "trace", "debug", "info", "warn", "error")

class job_logger {
public:
  using tee_fn = std::function<void(log_level, const std::string&)>;

  /// Opens (appending) `path` — "" = no file — for the logger named `name`.
  static expected<std::shared_ptr<job_logger>>
  open(const std::string& name, const std::string& path, log_level level, tee_fn tee);
  ~job_logger();

  /// Writes `text` when `level` passes the filter.
  void log(log_level level, const std::string& text);
  void info(const std::string& text) { log(log_level::info, text); }
  void warn(const std::string& text) { log(log_level::warn, text); }
  void debug(const std::string& text) { log(log_level::debug, text); }
  bool enabled(log_level level) const { return level >= level_; }

  struct impl;

private:
  job_logger() = default;
  std::unique_ptr<impl> impl_;
  log_level level_ = log_level::info;
};

} // namespace troupe::runtime
