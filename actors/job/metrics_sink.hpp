#pragma once
// metrics.jsonl as a subscriber of the job's events: one JSON object per
// `metrics` event ({"stage", "step", ...the metrics}), flushed per line.
// A `stage_started` event of a resumed stage first drops the lines that
// stage will write again (its steps past from_step, every step when it
// starts from 0) and those of the stages after it, so re-run steps are not
// duplicated; a torn last line (killed mid-write) is dropped too.

#include "actors/job/events.hpp"

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::actors::job {

/// Reads metrics.jsonl as metrics_sink writes it: each line's stage, step
/// and metrics in order (null = NaN); a line that is not one is skipped.
/// A scanner for these flat objects rather than a general JSON parser, so
/// that a 10,000-step run reads in milliseconds. Answers the lines handed.
size_t each_metrics_line(std::string_view text, const std::function<void(const metrics_reported&)>& fn);

class metrics_sink {
public:
  /// Opens (appending) `path`; `stage_order` is the job's stages in order.
  static expected<std::shared_ptr<metrics_sink>> open(std::string path,
                                                      std::vector<std::string> stage_order);
  ~metrics_sink();
  /// Handles one event.
  expected<void> operator()(const event& e);

private:
  metrics_sink() = default;
  expected<void> truncate(const std::string& stage, int64_t keep_until);
  expected<void> write(const metrics_reported& m);
  std::string path_;
  std::vector<std::string> stages_;
  std::FILE* f_ = nullptr;
};

} // namespace troupe::actors::job
