// metrics.jsonl read back by each_metrics_line (the dashboard's fast path
// for long runs) against a general JSON parser, line by line.
#include "actors/job/metrics_sink.hpp"
#include "runtime/file_io.hpp"
#include "tests/actors/job_harness.hpp"
#include "tests/support/temp_dir.hpp"

#include <cmath>

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::actors::rl::testing;

namespace {

std::vector<job::metrics_reported> read_all(std::string_view text) {
  std::vector<job::metrics_reported> out;
  job::each_metrics_line(text, [&](const job::metrics_reported& m) { out.push_back(m); });
  return out;
}

} // namespace

TEST(MetricsFile, TheFastReaderAgreesWithAJsonParserOnARealRun) {
  test::temp_dir tmp;
  auto cfg = parse_job(tiny_job(tmp.file("run")), {"stages=[sft, rm, rl]"});
  ASSERT_TRUE(cfg);
  job_harness h;
  auto end = h.run(*cfg);
  ASSERT_TRUE(end && end->state == job::job_state::succeeded);
  auto text = runtime::read_file(tmp.file("run") + "/metrics.jsonl");
  ASSERT_TRUE(text);
  auto lines = h.metrics();
  auto got = read_all(*text);
  ASSERT_EQ(got.size(), lines.size());
  size_t values = 0;
  for (size_t i = 0; i < lines.size(); ++i) {
    EXPECT_EQ(got[i].stage, lines[i]["stage"]);
    EXPECT_EQ(got[i].step, lines[i]["step"]);
    EXPECT_EQ(got[i].metrics.size(), lines[i].size() - 2);
    for (const auto& [k, v] : lines[i].items()) {
      if (k == "stage" || k == "step")
        continue;
      ASSERT_TRUE(got[i].metrics.count(k)) << k;
      if (v.is_null())
        EXPECT_TRUE(std::isnan(got[i].metrics.at(k))) << k;
      else
        EXPECT_EQ(got[i].metrics.at(k), v.get<double>()) << k; // bit for bit
      ++values;
    }
  }
  EXPECT_GT(values, 100u);
}

TEST(MetricsFile, OddLinesTakeTheSlowPathOrAreSkipped) {
  auto got = read_all("{\"stage\":\"rl\",\"step\":3,\"a\":1e-05,\"b\":null,\"c\":-0.0}\n"
                      "not json at all\n"
                      "{\"stage\":\"rl\",\"step\":4,\"we\\\"ird\":2.5}\n"
                      "{\"step\":5,\"a\":1}\n"
                      "{ \"stage\" : \"sft\", \"step\" : 6, \"x\" : 7 }\n"
                      "{\"stage\":\"rl\",\"step\":7,\"a\":");
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].step, 3);
  EXPECT_EQ(got[0].metrics.at("a"), 1e-05);
  EXPECT_TRUE(std::isnan(got[0].metrics.at("b")));
  EXPECT_TRUE(std::signbit(got[0].metrics.at("c")));
  EXPECT_EQ(got[1].metrics.at("we\"ird"), 2.5); // an escaped key: the JSON parser's
  EXPECT_EQ(got[2].stage, "sft");                // spaces: the JSON parser's
  EXPECT_EQ(got[2].metrics.at("x"), 7);
}
