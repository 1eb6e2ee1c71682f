// The learning-curve gate: the example jobs of the algorithm menu
// (docs/rlhf.md, "Algorithms"), shortened, run as a user runs them, and
// their learning metrics at each evaluated step must stay within the band
// recorded in tests/data/learning_bands.json (by bench/bench_algorithms.py
// --record-bands) and rise by the stated amount — so a change that breaks
// learning fails here, not only in a benchmark nobody reruns.

#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>

using namespace troupe;

namespace {

const std::string kSource = TROUPE_SOURCE_DIR;

nlohmann::json bands() {
  std::ifstream in(kSource + "/tests/data/learning_bands.json");
  return nlohmann::json::parse(in);
}

// {step: value} of `metric` in `stage` of the run's metrics.
std::map<int64_t, double> curve(const std::string& run_dir, const std::string& stage,
                                const std::string& metric) {
  std::map<int64_t, double> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (auto j = nlohmann::json::parse(line); j.value("stage", "") == stage && j.contains(metric))
      out[j["step"].get<int64_t>()] = j[metric].get<double>();
  return out;
}

class LearningCurves : public ::testing::TestWithParam<std::string> {};

} // namespace

TEST_P(LearningCurves, StayInTheirBandsAndRise) {
  const auto all = bands();
  const auto& job = all["jobs"][GetParam()];
  const double tolerance = all["tolerance"].get<double>();
  test::temp_dir dir;
  const auto run_dir = dir.file("run");
  std::string cmd = std::string{TROUPE_BINARY_PATH} + " run " + kSource + "/configs/" + GetParam() +
                    ".yaml --set run.dir=" + run_dir + " --set run.progress=none";
  for (const auto& s : job["sets"])
    cmd += " --set " + s.get<std::string>();
  int status = -1;
  auto out = test::run_command(cmd + " 2>&1", status);
  ASSERT_EQ(status, 0) << out;
  const auto stage = job["stage"].get<std::string>();
  for (const auto& [metric, band] : job["curves"].items()) {
    auto got = curve(run_dir, stage, metric);
    ASSERT_EQ(got.size(), band["steps"].size()) << metric << " at every recorded step";
    for (const auto& [step, want] : band["steps"].items()) {
      auto it = got.find(std::stoll(step));
      ASSERT_NE(it, got.end()) << metric << " at step " << step;
      EXPECT_NEAR(it->second, want.get<double>(), tolerance) << metric << " at step " << step;
    }
    // The rise: from step 0 (dpo: 0, its policy being its reference there).
    const double start = got.count(0) ? got.at(0) : 0.0;
    const double gain = got.rbegin()->second - start;
    EXPECT_GE(gain, band["min_gain"].get<double>())
        << metric << " rose " << gain << " from " << start << " by step " << got.rbegin()->first;
  }
}

INSTANTIATE_TEST_SUITE_P(Examples, LearningCurves,
                         ::testing::Values("quickstart", "grpo", "dapo", "gspo", "remax", "dpo",
                                           "agent_tool_sft"),
                         [](const auto& info) { return info.param; });
