#pragma once
// Whole jobs run in a test's own actor system: their summary and metrics
// lines, and the resume check (stop after 2 iterations, resume, compare
// with the uninterrupted run).
#include "actors/actor_system.hpp"
#include "actors/rl/job.hpp"
#include "runtime/file_io.hpp"
#include "tests/actors/job_yaml.hpp"
#include "tests/support/temp_dir.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace troupe::actors::rl::testing {

struct run_result {
  expected<job_summary> summary = make_error(errc::internal, "not run");
  std::vector<nlohmann::json> metrics;
};

/// Options that stop the job (as SIGINT does) once its rl step `step` is
/// logged; `stop` must outlive the run.
inline run_options stop_after_rl_step(std::atomic<bool>& stop, int64_t step) {
  run_options o;
  o.stop = &stop;
  o.on_progress = [&stop, step](const progress_event& e) {
    if (e.stage == "rl" && e.step == step)
      stop = true;
  };
  return o;
}

inline run_result run(const job_config& cfg, run_options opts = {}) {
  run_result out;
  {
    caf::actor_system_config sc;
    actors::configure(sc);
    caf::actor_system sys{sc};
    out.summary = run_job(sys, cfg, opts);
  }
  std::ifstream in(std::filesystem::path{cfg.run.dir} / "metrics.jsonl");
  std::string line;
  while (std::getline(in, line))
    out.metrics.push_back(nlohmann::json::parse(line));
  return out;
}

inline std::vector<nlohmann::json> stage_lines(const std::vector<nlohmann::json>& all,
                                               const std::string& stage) {
  std::vector<nlohmann::json> out;
  for (const auto& j : all)
    if (j["stage"] == stage)
      out.push_back(j);
  return out;
}

// The tiny job with `sets` (and `more_yaml` appended) runs 4 iterations straight, and 2, a stop (as
// SIGINT does),
// --resume, 2 more: the same metrics and bit-identical weights.
inline void expect_resume_continues_exactly(const std::vector<std::string>& sets,
                                            const std::string& more_yaml = "") {
  test::temp_dir tmp;
  auto straight = parse_job(tiny_job(tmp.file("a")) + more_yaml, sets);
  auto split = parse_job(tiny_job(tmp.file("b")) + more_yaml, sets);
  ASSERT_TRUE(straight && split);
  auto a = run(*straight);
  ASSERT_TRUE(a.summary) << describe(a.summary.error());

  std::atomic<bool> stop{false};
  auto b1 = run(*split, stop_after_rl_step(stop, 2));
  ASSERT_TRUE(b1.summary) << describe(b1.summary.error());
  EXPECT_TRUE(b1.summary->stopped);
  EXPECT_EQ(stage_lines(b1.metrics, "rl").size(), 3u); // steps 0, 1, 2
  run_options second;
  second.resume = true;
  auto b2 = run(*split, second);
  ASSERT_TRUE(b2.summary) << describe(b2.summary.error());
  EXPECT_FALSE(b2.summary->stopped);
  EXPECT_TRUE(b2.summary->stages[0].skipped);
  EXPECT_TRUE(b2.summary->stages[1].skipped);

  ASSERT_EQ(a.metrics.size(), b2.metrics.size());
  for (size_t i = 0; i < a.metrics.size(); ++i)
    EXPECT_EQ(deterministic_part(a.metrics[i]), deterministic_part(b2.metrics[i])) << "line " << i;
  expect_same_final_weights((tmp.path() / "a").string(), (tmp.path() / "b").string());
}

} // namespace troupe::actors::rl::testing
