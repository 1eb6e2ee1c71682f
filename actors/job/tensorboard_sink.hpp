#pragma once
// Every scalar of a run as TensorBoard event files, a subscriber of the
// job's events beside metrics.jsonl (metrics_sink.hpp).
//
// NOTE [tensorboard files]: `<run dir>/tensorboard/<stage>/` holds one
// TensorBoard run per stage (sft, rm, rl: their steps each count from 1),
// tags are the metric keys ("actor/pg_loss"). A file is a sequence of
// TFRecords — u64 length, u32 masked CRC32C of the length, the bytes, u32
// masked CRC32C of the bytes (masked = rotr(crc, 15) + 0xa282ead8) — each
// an `Event` message (wall_time 1 double, step 2 int64, file_version 3
// string, summary 5, session_log 7) whose `Summary` holds `Value{tag 1,
// simple_value 2 float}`s. The first record of a file names the version,
// "brain.Event:2". Each start of a stage opens a new file; a resumed stage
// first writes `SessionLog{status: START}` at its first re-run step, which
// tells TensorBoard to drop that stage's points from that step on, the same
// points metrics.jsonl drops.

#include "actors/job/events.hpp"

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

namespace troupe::actors::job {

/// CRC32C (Castagnoli) of `bytes`, and its masked form used by TFRecord.
uint32_t crc32c(std::string_view bytes) noexcept;
uint32_t masked_crc32c(std::string_view bytes) noexcept;

class tensorboard_sink {
public:
  /// Writes under `dir` (created on the first stage).
  static std::shared_ptr<tensorboard_sink> open(std::string dir);
  ~tensorboard_sink();
  /// Handles one event.
  expected<void> operator()(const event& e);

private:
  tensorboard_sink() = default;
  expected<void> start_file(const stage_started& s);
  expected<void> write_record(const std::string& bytes);
  expected<void> write_scalars(const metrics_reported& m, int64_t time_us);
  std::string dir_;
  std::string stage_;
  std::string path_;
  std::FILE* f_ = nullptr;
};

} // namespace troupe::actors::job
