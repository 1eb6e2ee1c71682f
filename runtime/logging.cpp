#include "runtime/logging.hpp"

#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

#include <array>
#include <mutex>

namespace troupe::runtime {

namespace {

spdlog::level::level_enum to_spdlog(log_level l) {
  switch (l) {
  case log_level::trace:
    return spdlog::level::trace;
  case log_level::debug:
    return spdlog::level::debug;
  case log_level::info:
    return spdlog::level::info;
  case log_level::warn:
    return spdlog::level::warn;
  case log_level::error:
    return spdlog::level::err;
  }
  return spdlog::level::info;
}

log_level from_spdlog(spdlog::level::level_enum l) {
  switch (l) {
  case spdlog::level::trace:
    return log_level::trace;
  case spdlog::level::debug:
    return log_level::debug;
  case spdlog::level::info:
    return log_level::info;
  case spdlog::level::warn:
    return log_level::warn;
  default:
    return log_level::error;
  }
}

// Hands each line's text (without the file's time and level prefix) to the tee.
class tee_sink final : public spdlog::sinks::base_sink<std::mutex> {
public:
  explicit tee_sink(job_logger::tee_fn tee) : tee_(std::move(tee)) {}

protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    tee_(from_spdlog(msg.level), std::string{msg.payload.data(), msg.payload.size()});
  }
  void flush_() override {}

private:
  job_logger::tee_fn tee_;
};

} // namespace

struct job_logger::impl {
  std::shared_ptr<spdlog::logger> logger;
};

expected<std::shared_ptr<job_logger>>
job_logger::open(const std::string& name, const std::string& path, log_level level, tee_fn tee) {
  std::vector<spdlog::sink_ptr> sinks;
  try {
    if (!path.empty()) {
      auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path, false);
      file->set_pattern("%Y-%m-%dT%H:%M:%S.%e %-5l %v");
      sinks.push_back(std::move(file));
    }
  } catch (const spdlog::spdlog_ex& e) {
    return make_error(errc::io_error, "log file " + path + ": " + e.what());
  }
  if (tee)
    sinks.push_back(std::make_shared<tee_sink>(std::move(tee)));
  std::shared_ptr<job_logger> out{new job_logger};
  out->impl_ = std::make_unique<impl>();
  // Not registered with spdlog: two jobs may share a name in one process.
  out->impl_->logger = std::make_shared<spdlog::logger>(name, sinks.begin(), sinks.end());
  out->impl_->logger->set_level(to_spdlog(level));
  out->impl_->logger->flush_on(spdlog::level::trace);
  out->level_ = level;
  return out;
}

job_logger::~job_logger() = default;

void job_logger::log(log_level level, const std::string& text) {
  if (!enabled(level))
    return;
  impl_->logger->log(to_spdlog(level), "{}", text);
}

} // namespace troupe::runtime
