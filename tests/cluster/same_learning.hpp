#pragma once
// A run's metrics without the wall-clock ones, and the check that two runs
// learned alike (the same numbers within a tolerance: data-parallel sums
// add in another order).

#include "tests/actors/job_yaml.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace troupe::test {

/// <run dir>/metrics.jsonl without the wall-clock metrics.
inline std::vector<nlohmann::json> metrics_of(const std::string& run_dir) {
  std::vector<nlohmann::json> out;
  std::ifstream in(std::filesystem::path{run_dir} / "metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    out.push_back(actors::rl::testing::deterministic_part(nlohmann::json::parse(line)));
  return out;
}

/// Every numeric metric of `want` in `got` within `rel` (relative, at least
/// absolute), line by line; more than 100 numbers compared.
inline void expect_same_learning(const std::vector<nlohmann::json>& want, const std::vector<nlohmann::json>& got,
                                 double rel = 1e-5) {
  ASSERT_EQ(want.size(), got.size());
  int compared = 0;
  for (size_t i = 0; i < want.size(); ++i)
    for (auto it = want[i].begin(); it != want[i].end(); ++it) {
      ASSERT_TRUE(got[i].contains(it.key())) << it.key();
      if (!it.value().is_number())
        continue;
      double x = it.value().get<double>(), y = got[i][it.key()].get<double>();
      EXPECT_NEAR(x, y, rel * std::max(1.0, std::abs(x))) << want[i]["stage"] << " " << it.key();
      ++compared;
    }
  EXPECT_GT(compared, 100);
}

} // namespace troupe::test
