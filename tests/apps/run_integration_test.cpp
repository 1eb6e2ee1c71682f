// `troupe run` and `troupe config show` as a user runs them: a process killed
// (SIGKILL) at arbitrary moments, checkpoints included, never leaves a
// checkpoint that loads half-written and resumes to the end; SIGINT stops
// with a checkpoint and exit status 130.
#include "runtime/checkpoint.hpp"
#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

using namespace troupe;

namespace {

std::string tiny_job(const std::string& dir) {
  return "run: {dir: '" + dir + "', seed: 5, progress: lines, threads: 1}\n"
         "stages: [sft, rl]\n"
         "data: {task: sort, min_digits: 2, max_digits: 3, train_size: 64, eval_size: 8}\n"
         "model: {hidden_size: 32, intermediate_size: 64, num_layers: 2, num_heads: 2,\n"
         "        num_kv_heads: 1, max_position_embeddings: 24}\n"
         "sft: {steps: 4, batch_size: 8, eval_every: 0}\n"
         "rl: {iterations: 40, prompts_per_iteration: 8, minibatches: 2, eval_every: 0,\n"
         "     checkpoint_every: 1, generation: {max_tokens: 5},\n"
         "     rollout: {num_blocks: 64, block_size: 4}}\n";
}

pid_t start(const std::vector<std::string>& args) {
  pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> argv;
    std::string bin = TROUPE_BINARY_PATH;
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    // Quiet: progress lines go to /dev/null.
    std::freopen("/dev/null", "w", stderr);
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

int wait_exit(pid_t pid, int timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    auto r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid)
      return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  ADD_FAILURE() << "troupe run did not finish within " << timeout_s << " s";
  return -1;
}

} // namespace

TEST(RunCli, KilledAtAnyMomentNeverLeavesAHalfWrittenCheckpoint) {
  test::temp_dir tmp;
  auto cfg = tmp.write("job.yaml", tiny_job(tmp.file("run")));
  auto ckpts = tmp.path() / "run" / "rl" / "checkpoints";
  // Kill at staggered moments after RL checkpoints begin to appear: with a
  // checkpoint every iteration, some kills land inside a checkpoint write.
  int kills = 0;
  for (int round = 0; round < 6; ++round) {
    std::vector<std::string> args = {"run", cfg};
    if (round > 0)
      args.push_back("--resume");
    auto pid = start(args);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    bool finished = false;
    while (!std::filesystem::exists(ckpts / "latest")) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        finished = true;
        break;
      }
      ASSERT_LT(std::chrono::steady_clock::now(), deadline);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (finished)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(37 * round + 11));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ++kills;
    auto latest = runtime::latest_checkpoint(ckpts.string());
    ASSERT_TRUE(latest) << describe(latest.error());
    auto files = runtime::read_checkpoint(*latest);
    EXPECT_TRUE(files) << "round " << round << ": " << describe(files.error());
  }
  EXPECT_GE(kills, 1);
  // Whatever was killed where, the run resumes to its end.
  auto pid = start({"run", cfg, "--resume"});
  auto status = wait_exit(pid, 300);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(std::filesystem::exists(tmp.path() / "run" / "rl" / "done"));
  EXPECT_TRUE(std::filesystem::exists(tmp.path() / "run" / "rl" / "model" / "model.safetensors"));
}

TEST(RunCli, SigintStopsWithACheckpointAndResumes) {
  test::temp_dir tmp;
  auto cfg = tmp.write("job.yaml", tiny_job(tmp.file("run")));
  auto ckpts = tmp.path() / "run" / "rl" / "checkpoints";
  auto pid = start({"run", cfg});
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!std::filesystem::exists(ckpts / "latest")) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ::kill(pid, SIGINT);
  auto status = wait_exit(pid, 60);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "run" / "rl" / "done"));
  auto resumed = start({"run", cfg, "--resume"});
  status = wait_exit(resumed, 300);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(std::filesystem::exists(tmp.path() / "run" / "rl" / "done"));
}

TEST(RunCli, ConfigShowResolvesAndBadFilesNameTheLine) {
  test::temp_dir tmp;
  int status = 0;
  auto out = test::run_command(std::string{TROUPE_BINARY_PATH} + " config show " + TROUPE_SOURCE_DIR +
                                   "/configs/quickstart.yaml --set rl.iterations=5 --no-comments",
                               status);
  EXPECT_EQ(status, 0);
  EXPECT_NE(out.find("iterations: 5"), std::string::npos) << out;
  EXPECT_NE(out.find("algorithm: ppo"), std::string::npos) << out;
  auto bad = tmp.write("bad.yaml", "rl:\n  minibatches: 3\n");
  auto err = test::run_command(std::string{TROUPE_BINARY_PATH} + " run " + bad + " 2>&1", status);
  EXPECT_NE(status, 0);
  EXPECT_NE(err.find("bad.yaml:2:16: rl.minibatches"), std::string::npos) << err;
}

TEST(RunCli, ASecondSignalCancelsWithoutACheckpointAndTheJournalSaysSo) {
  test::temp_dir tmp;
  auto cfg = tmp.write("job.yaml", tiny_job(tmp.file("run")));
  auto journal = tmp.path() / "run" / "events.jsonl";
  auto pid = start({"run", cfg});
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!std::filesystem::exists(tmp.path() / "run" / "rl" / "checkpoints" / "latest")) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ::kill(pid, SIGTERM);
  ::kill(pid, SIGINT);
  auto status = wait_exit(pid, 60);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
  std::ifstream in(journal);
  std::string line, last;
  while (std::getline(in, line))
    last = line;
  EXPECT_NE(last.find("\"kind\":\"state\""), std::string::npos) << last;
  EXPECT_NE(last.find("\"to\":\"cancelled\""), std::string::npos) << last;
}

TEST(Examples, JobControlPausesUpdatesAndResumes) {
  test::temp_dir tmp;
  int status = 0;
  auto out = test::run_command(std::string{TROUPE_JOB_CONTROL_EXAMPLE} + " " + tmp.file("run") +
                                 " 2>&1",
                               status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("state running -> paused at rl step 2 (start)"), std::string::npos) << out;
  EXPECT_NE(out.find("setting rl.kl.coef = 0.2 (was 0.05) from iteration 2"), std::string::npos)
    << out;
  EXPECT_NE(out.find("rl step 2/3 kl_coeff 0.200000"), std::string::npos) << out;
  EXPECT_NE(out.find("final state succeeded"), std::string::npos) << out;
}
