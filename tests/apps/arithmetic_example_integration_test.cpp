// The learning example end to end, as a user runs it (docs/data-and-rewards.md,
// "A learning example"): scripts/make_arithmetic_task.py makes the data and
// the Qwen2-shaped model, `troupe run configs/arithmetic.yaml` runs SFT and
// two GRPO iterations, and SFT has taught the answer format; the same run
// scored by the Python reward server (configs/arithmetic_remote.yaml).

#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <csignal>
#include <fstream>
#include <thread>

using namespace troupe;

namespace {

const std::string kSource = TROUPE_SOURCE_DIR;

std::vector<nlohmann::json> stage_lines(const std::string& run_dir, const std::string& stage) {
  std::vector<nlohmann::json> out;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);)
    if (auto j = nlohmann::json::parse(line); j.value("stage", "") == stage)
      out.push_back(std::move(j));
  return out;
}

/// The task the configs' comments make, in `dir`/data.
void make_task(const test::temp_dir& dir) {
  int status = -1;
  auto out =
      test::run_command("/usr/bin/python3 " + kSource + "/scripts/make_arithmetic_task.py --out " +
                            dir.file("data") + " --max-number 20 --shared-equations 2>&1",
                        status);
  ASSERT_EQ(status, 0) << out;
}

std::string run_job(const test::temp_dir& dir, const std::string& config,
                    const std::vector<std::string>& sets, int& status) {
  std::string cmd = std::string{TROUPE_BINARY_PATH} + " run " + kSource + "/configs/" + config +
                    " --set data.train_file=" + dir.file("data/train.jsonl") +
                    " --set data.eval_file=" + dir.file("data/test.jsonl") +
                    " --set model.path=" + dir.file("data/model") + " --set run.progress=none";
  for (const auto& s : sets)
    cmd += " --set " + s;
  return test::run_command(cmd + " 2>&1", status);
}

} // namespace

TEST(ArithmeticExample, SftLearnsTheFormatThenGrpoRuns) {
  test::temp_dir dir;
  make_task(dir);
  const auto run_dir = dir.file("run");
  int status = -1;
  auto out = run_job(dir, "arithmetic.yaml",
                     {"run.dir=" + run_dir, "rl.iterations=2", "rl.eval_every=2"}, status);
  ASSERT_EQ(status, 0) << out;
  auto sft = stage_lines(run_dir, "sft");
  ASSERT_FALSE(sft.empty());
  ASSERT_TRUE(sft.back().contains("val/format_rate")) << sft.back().dump();
  EXPECT_GE(sft.back()["val/format_rate"].get<double>(), 0.9)
      << "SFT teaches the \"#### n\" format: " << sft.back().dump();
  EXPECT_EQ(sft.front()["data/template_divergences"].get<double>(), 0.0) << "ChatML is append-only";
  auto rl = stage_lines(run_dir, "rl");
  ASSERT_EQ(rl.size(), 3u); // step 0 and two iterations
  EXPECT_TRUE(rl[0].contains("val/accuracy"));
  EXPECT_TRUE(rl[2].contains("val/accuracy"));
  for (size_t i = 1; i < rl.size(); ++i) {
    EXPECT_GT(rl[i]["critic/score/mean"].get<double>(), 0.0) << "formatted answers score";
    EXPECT_TRUE(rl[i].contains("rollout_corr/logprob_abs_diff_mean"));
  }
}

TEST(ArithmeticExample, TheSameRunScoredByThePythonRewardServer) {
  int missing = 0;
  test::run_command("/usr/bin/python3 -c 'import grpc' > /dev/null 2>&1", missing);
  if (missing != 0)
    GTEST_SKIP() << "/usr/bin/python3 lacks grpc (install python3-grpcio)";
  test::temp_dir dir;
  make_task(dir);
  const auto port_file = dir.file("port");
  auto server = test::start_process("/usr/bin/python3",
                                    {kSource + "/examples/python/reward_server.py", "--port", "0",
                                     "--port-file", port_file, "--extract", "strict"},
                                    dir.file("server.log"));
  std::string port;
  for (int i = 0; i < 3000 && port.empty(); ++i) {
    std::ifstream f(port_file);
    if (!(f >> port))
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(port.empty()) << "the reward server did not start in 30 s";
  const auto run_dir = dir.file("run");
  int status = -1;
  auto out = run_job(dir, "arithmetic_remote.yaml",
                     {"run.dir=" + run_dir, "sft.steps=20", "sft.eval_every=0", "rl.iterations=1",
                      "rl.reward.remote.address=127.0.0.1:" + port},
                     status);
  ::kill(server, SIGKILL);
  test::wait_exit(server, std::chrono::seconds(10));
  ASSERT_EQ(status, 0) << out;
  auto rl = stage_lines(run_dir, "rl");
  ASSERT_EQ(rl.size(), 2u);
  EXPECT_TRUE(rl[1].contains("critic/score/mean")) << rl[1].dump();
  EXPECT_TRUE(rl[1].contains("timing_s/reward_hidden")) << "scored while generating";
}
