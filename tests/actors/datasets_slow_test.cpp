// A dataset file far larger than the index kept of it (NOTE [dataset files]):
// a million rows open with a small resident-memory growth and read back
// exactly.

#include "actors/rl/data.hpp"
#include "actors/rl/datasets.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

using namespace troupe;
using namespace troupe::actors::rl;

namespace {

/// This process's resident memory in bytes (VmRSS).
int64_t resident_bytes() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0)
      return std::stoll(line.substr(6)) * 1024;
  return -1;
}

TEST(DatasetsLarge, AMillionRowsOpenWithSmallMemoryGrowth) {
  constexpr int64_t rows = 1'000'000;
  test::temp_dir dir;
  auto path = dir.file("big.jsonl");
  {
    // ~190 bytes a row: a ~190 MB file.
    std::ofstream out(path, std::ios::binary);
    std::string pad(120, 'x');
    for (int64_t i = 0; i < rows; ++i)
      out << "{\"prompt\": \"Question " << i << ": " << pad << "\", \"answer\": \"" << i * 7
          << "\", \"metadata\": {\"row\": " << i << "}}\n";
  }
  auto before = resident_bytes();
  ASSERT_GT(before, 0);
  data_config c;
  c.train_file = path;
  auto d = load_job_data(c, {}, {false, false});
  ASSERT_TRUE(d) << describe(d.error());
  auto growth = resident_bytes() - before;
  EXPECT_EQ(d->train.size(), rows);
  EXPECT_LT(growth, int64_t{64} << 20) << "resident memory grew by " << growth << " bytes";
  std::printf("1M-row file: resident memory grew by %.1f MiB\n",
              static_cast<double>(growth) / (1 << 20));
  // Rows come back exactly, wherever a shuffled batch points.
  for (auto i : batch_indices(rows, 99, 123'456, 64)) {
    auto r = d->train.at(i);
    ASSERT_TRUE(r) << describe(r.error());
    EXPECT_EQ(r->answer, std::to_string(i * 7));
    EXPECT_EQ(r->metadata, "{\"row\":" + std::to_string(i) + "}");
  }
}

} // namespace
