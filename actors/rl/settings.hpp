#pragma once
// Runtime settings: the few job settings a running job may change
// (`update KEY VALUE`), validated exactly like the config and recorded in
// <run dir>/settings.jsonl so that a resumed run continues with them.
//
// NOTE [runtime settings]: an update is checked when it arrives (the key is
// one of runtime_settings(); the job with the new value passes every check of
// load_job), applied by the driver at the start of the next RL iteration, and
// recorded as {"iteration": N, "key", "value"} — N the first iteration (from
// 1) that runs with it. A resumed run applies every recorded update of the
// iterations it starts from and before, and the later ones when it reaches
// them, so it repeats what the interrupted run did.

#include "actors/rl/job_config.hpp"

#include <mutex>
#include <string>
#include <vector>

namespace troupe::actors::rl {

/// The keys a running job accepts.
const std::vector<std::string>& runtime_settings();

/// `c` with `key` set to `value` (parsed as YAML), checked like a job file;
/// errors name the key and the reason.
expected<job_config> with_setting(const job_config& c, const std::string& key,
                                  const std::string& value);

/// The current value of a runtime setting, as text ("0.05").
std::string setting_value(const job_config& c, const std::string& key);

struct recorded_setting {
  int64_t iteration = 0;
  std::string key;
  std::string value;
};

/// Reads <run dir>/settings.jsonl ([] when absent); a torn last line is dropped.
expected<std::vector<recorded_setting>> read_settings(const std::string& path);
/// Appends one record (flushed).
expected<void> append_setting(const std::string& path, const recorded_setting& s);

/// The job actor's view: the job as the accepted updates leave it, so that
/// each update is checked against the ones before it.
class settings_book {
public:
  explicit settings_book(job_config c) : latest_(std::move(c)) {}
  /// Checks and accepts an update; answers the value as the job will hold it.
  expected<std::string> accept(const std::string& key, const std::string& value);

private:
  std::mutex mu_;
  job_config latest_;
};

} // namespace troupe::actors::rl
