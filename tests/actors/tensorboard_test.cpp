// TensorBoard event files (NOTE [tensorboard files]) read back by a decoder
// of the tests' own: TFRecord framing with both CRCs checked, each Event
// parsed by protobuf's schema-less wire reader (UnknownFieldSet), and
// TensorBoard's rule for a restart (a SessionLog START at step s drops the
// run's points from s on) applied. What it reads must be metrics.jsonl.
#include "actors/job/tensorboard_sink.hpp"
#include "runtime/file_io.hpp"
#include "tests/actors/job_harness.hpp"
#include "tests/support/temp_dir.hpp"

#include <google/protobuf/unknown_field_set.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::actors::rl;
using namespace troupe::actors::rl::testing;
namespace fs = std::filesystem;
using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

namespace {

uint64_t le(const std::string& b, size_t at, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i)
    v = v << 8 | static_cast<unsigned char>(b[at + static_cast<size_t>(i)]);
  return v;
}

// The records of one file; a bad length or CRC fails the test.
std::vector<std::string> records(const fs::path& file) {
  auto text = runtime::read_file(file.string());
  EXPECT_TRUE(text) << file;
  std::string bytes = text ? *text : std::string{};
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (bytes.size() - pos < 12) {
      ADD_FAILURE() << file << ": torn record header at " << pos;
      break;
    }
    auto len = le(bytes, pos, 8);
    EXPECT_EQ(le(bytes, pos + 8, 4), job::masked_crc32c(std::string_view{bytes}.substr(pos, 8)))
        << file << ": length CRC at " << pos;
    if (bytes.size() - pos - 12 < len + 4) {
      ADD_FAILURE() << file << ": torn record at " << pos;
      break;
    }
    auto data = bytes.substr(pos + 12, len);
    EXPECT_EQ(le(bytes, pos + 12 + len, 4), job::masked_crc32c(data)) << file << ": data CRC at " << pos;
    out.push_back(std::move(data));
    pos += 12 + len + 4;
  }
  return out;
}

struct tb_run {
  std::map<std::pair<int64_t, std::string>, float> points;
  int restarts = 0;
  int files = 0;
  std::vector<std::string> versions;
};

const UnknownField* field(const UnknownFieldSet& s, int number) {
  for (int i = 0; i < s.field_count(); ++i)
    if (s.field(i).number() == number)
      return &s.field(i);
  return nullptr;
}

void apply_summary(const std::string& bytes, int64_t step, tb_run& run) {
  UnknownFieldSet summary;
  ASSERT_TRUE(summary.ParseFromString(bytes));
  for (int i = 0; i < summary.field_count(); ++i) {
    ASSERT_EQ(summary.field(i).number(), 1); // Summary.value
    UnknownFieldSet value;
    ASSERT_TRUE(value.ParseFromString(summary.field(i).length_delimited()));
    auto* tag = field(value, 1);
    auto* simple = field(value, 2);
    ASSERT_TRUE(tag && simple && simple->type() == UnknownField::TYPE_FIXED32);
    uint32_t raw = simple->fixed32();
    float v;
    std::memcpy(&v, &raw, sizeof v);
    bool fresh = run.points.emplace(std::pair{step, tag->length_delimited()}, v).second;
    EXPECT_TRUE(fresh) << "step " << step << " " << tag->length_delimited() << " written twice";
  }
}

// One stage's run as TensorBoard would load it: files in name order.
tb_run read_run(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& f : fs::directory_iterator(dir))
    files.push_back(f.path());
  std::sort(files.begin(), files.end());
  tb_run run;
  for (const auto& f : files) {
    EXPECT_NE(f.filename().string().find("tfevents"), std::string::npos) << f;
    ++run.files;
    for (const auto& rec : records(f)) {
      UnknownFieldSet e;
      EXPECT_TRUE(e.ParseFromString(rec));
      auto* wall = field(e, 1);
      EXPECT_TRUE(wall && wall->type() == UnknownField::TYPE_FIXED64);
      auto* s = field(e, 2);
      int64_t step = s ? static_cast<int64_t>(s->varint()) : 0;
      if (auto* v = field(e, 3))
        run.versions.push_back(v->length_delimited());
      if (auto* log = field(e, 7)) {
        UnknownFieldSet sl;
        EXPECT_TRUE(sl.ParseFromString(log->length_delimited()));
        auto* status = field(sl, 1);
        if (status && status->varint() == 1) { // START: a restart purges from `step` on
          ++run.restarts;
          for (auto it = run.points.begin(); it != run.points.end();)
            it = it->first.first >= step ? run.points.erase(it) : std::next(it);
        }
      }
      if (auto* summary = field(e, 5))
        apply_summary(summary->length_delimited(), step, run);
    }
  }
  return run;
}

// Every metrics.jsonl value of each stage is the stage run's point, and
// nothing else is there.
void expect_same_as_metrics(const std::vector<nlohmann::json>& metrics, const fs::path& tb,
                            std::map<std::string, tb_run>& runs) {
  std::map<std::string, size_t> counts;
  for (const auto& line : metrics) {
    auto stage = line.at("stage").get<std::string>();
    if (!runs.count(stage))
      runs[stage] = read_run(tb / stage);
    auto& run = runs[stage];
    auto step = line.at("step").get<int64_t>();
    for (const auto& [k, v] : line.items()) {
      if (k == "stage" || k == "step")
        continue;
      ++counts[stage];
      auto it = run.points.find({step, k});
      ASSERT_NE(it, run.points.end()) << stage << " step " << step << " " << k;
      if (v.is_null())
        EXPECT_FALSE(std::isfinite(it->second)) << k;
      else
        EXPECT_EQ(it->second, static_cast<float>(v.get<double>())) << stage << " step " << step << " " << k;
    }
  }
  for (const auto& [stage, run] : runs) {
    EXPECT_EQ(run.points.size(), counts[stage]) << stage;
    ASSERT_FALSE(run.versions.empty());
    for (const auto& v : run.versions)
      EXPECT_EQ(v, "brain.Event:2");
  }
}

job_config tiny(const std::string& dir, std::vector<std::string> sets) {
  auto cfg = parse_job(tiny_job(dir), std::move(sets));
  EXPECT_TRUE(cfg) << describe(cfg.error());
  return *cfg;
}

} // namespace

TEST(TensorBoard, Crc32cMatchesTheKnownVectors) {
  EXPECT_EQ(job::crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(job::crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(job::crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  uint32_t c = job::crc32c("123456789");
  EXPECT_EQ(job::masked_crc32c("123456789"), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(TensorBoard, EveryScalarOfEveryStageReadsBackAsInMetricsJsonl) {
  test::temp_dir tmp;
  job_harness h;
  auto end = h.run(tiny(tmp.file("run"), {"stages=[sft, rm, rl]"}));
  ASSERT_TRUE(end && end->state == job::job_state::succeeded);
  std::map<std::string, tb_run> runs;
  expect_same_as_metrics(h.metrics(), tmp.path() / "run" / "tensorboard", runs);
  EXPECT_EQ(runs.size(), 3u);
  for (const auto& [stage, run] : runs) {
    EXPECT_EQ(run.restarts, 0) << stage;
    EXPECT_EQ(run.files, 1) << stage;
  }
  EXPECT_GT(runs["rl"].points.size(), 3u * 20u);
}

TEST(TensorBoard, AResumedStageDropsItsRerunStepsLikeMetricsJsonl) {
  test::temp_dir tmp;
  auto cfg = tiny(tmp.file("run"), {"stages=[rl]", "rl.critic.init=base", "rl.iterations=4",
                                    "rl.checkpoint_every=2"});
  {
    job_harness h;
    ASSERT_TRUE(h.spawn(cfg));
    ASSERT_TRUE(h.ask(job::pause_at_atom::value, std::string{"rl:4"}));
    ASSERT_TRUE(h.ask(job::start_atom::value));
    ASSERT_TRUE(h.events->wait_for_state(job::job_state::paused));
    ASSERT_TRUE(h.ask(job::cancel_atom::value, true)); // step 3 is past the checkpoint of 2
    auto end = h.await();
    ASSERT_TRUE(end && end->state == job::job_state::cancelled);
  }
  run_options resume;
  resume.resume = true;
  job_harness h;
  auto end = h.run(cfg, resume);
  ASSERT_TRUE(end && end->state == job::job_state::succeeded);
  std::map<std::string, tb_run> runs;
  expect_same_as_metrics(h.metrics(), tmp.path() / "run" / "tensorboard", runs);
  EXPECT_EQ(runs["rl"].restarts, 1);
  EXPECT_EQ(runs["rl"].files, 2);
  EXPECT_TRUE(runs["rl"].points.count({4, "actor/pg_loss"}));
}
