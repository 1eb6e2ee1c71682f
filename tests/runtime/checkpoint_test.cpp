#include "runtime/checkpoint.hpp"

#include "runtime/file_io.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

using namespace troupe;
using namespace troupe::runtime;
namespace fs = std::filesystem;

TEST(Checkpoint, WritesReadsAndPointsAtTheNewest) {
  test::temp_dir tmp;
  auto parent = tmp.file("ckpt");
  EXPECT_EQ(code_of(latest_checkpoint(parent).error()), errc::not_found);
  checkpoint_files files{{"a.bin", std::string("\0\1\2", 3)}, {"b.json", "{}"}};
  ASSERT_TRUE(write_checkpoint(parent, "iter_1", files));
  files["a.bin"] = "second";
  ASSERT_TRUE(write_checkpoint(parent, "iter_2", files));
  auto latest = latest_checkpoint(parent);
  ASSERT_TRUE(latest);
  EXPECT_EQ(fs::path{*latest}.filename(), "iter_2");
  auto back = read_checkpoint(*latest);
  ASSERT_TRUE(back) << describe(back.error());
  EXPECT_EQ(*back, files);
  EXPECT_FALSE(write_checkpoint(parent, "a/b", files));
  EXPECT_FALSE(write_checkpoint(parent, "x", {{"manifest.json", ""}}));
}

TEST(Checkpoint, KeepsOnlyTheNewest) {
  test::temp_dir tmp;
  auto parent = tmp.file("ckpt");
  for (int i = 1; i <= 4; ++i)
    ASSERT_TRUE(write_checkpoint(parent, "iter_" + std::to_string(i), {{"f", "x"}}, 2));
  EXPECT_FALSE(fs::exists(fs::path{parent} / "iter_1"));
  EXPECT_FALSE(fs::exists(fs::path{parent} / "iter_2"));
  EXPECT_TRUE(fs::exists(fs::path{parent} / "iter_3"));
  EXPECT_TRUE(fs::exists(fs::path{parent} / "iter_4"));
}

TEST(Checkpoint, DamagedFilesAreRefused) {
  test::temp_dir tmp;
  auto parent = tmp.file("ckpt");
  ASSERT_TRUE(write_checkpoint(parent, "c", {{"state", "0123456789"}, {"meta", "m"}}));
  auto dir = fs::path{parent} / "c";
  // Truncated.
  { std::ofstream(dir / "state", std::ios::trunc) << "01234"; }
  auto r = read_checkpoint(dir.string());
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::corrupted);
  EXPECT_NE(describe(r.error()).find("state has 5 bytes"), std::string::npos) << describe(r.error());
  // Same size, other bytes.
  { std::ofstream(dir / "state", std::ios::trunc) << "0123456780"; }
  r = read_checkpoint(dir.string());
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("fails its checksum"), std::string::npos);
  // Missing file.
  fs::remove(dir / "meta");
  EXPECT_EQ(code_of(read_checkpoint(dir.string()).error()), errc::corrupted);
  // A folder left by a write that never finished is not a checkpoint.
  fs::create_directory(fs::path{parent} / "d.tmp");
  EXPECT_EQ(fs::path{*latest_checkpoint(parent)}.filename(), "c");
}
