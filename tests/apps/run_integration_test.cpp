// `troupe run` and `troupe config show` as a user runs them: a process killed
// (SIGKILL) at arbitrary moments, checkpoints included, never leaves a
// checkpoint that loads half-written and resumes to the end; SIGINT stops
// with a checkpoint and exit status 130; SIGTERM ends `troupe run`, a driver
// and a worker within 10 s in every state (NOTE [stop signals]).
#include "runtime/checkpoint.hpp"
#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <set>
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
  return test::start_process(TROUPE_BINARY_PATH, args); // quiet: progress to /dev/null
}

int wait_exit(pid_t pid, int timeout_s) {
  auto status = test::wait_exit(pid, std::chrono::seconds(timeout_s));
  if (!status)
    ADD_FAILURE() << "troupe run did not finish within " << timeout_s << " s";
  return status.value_or(-1);
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
  ::kill(pid, SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(50)); // (pending signals race for threads)
  ::kill(pid, SIGTERM);
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

namespace {

// The child processes of `pid` (its workers), from /proc.
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(task.path() / "children");
    pid_t c;
    while (in >> c)
      out.push_back(c);
  }
  return out;
}

void wait_for_file(const std::filesystem::path& path, pid_t pid) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  while (!std::filesystem::exists(path)) {
    int status = 0;
    ASSERT_NE(::waitpid(pid, &status, WNOHANG), pid) << "ended before " << path;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "no " << path;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Sends SIGTERM and answers (seconds until the process ended, its status).
std::pair<double, std::optional<int>> sigterm(pid_t pid) {
  auto t0 = std::chrono::steady_clock::now();
  ::kill(pid, SIGTERM);
  auto status = test::wait_exit(pid, std::chrono::seconds(30));
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), status};
}

std::string last_line(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    last = line;
  return last;
}

// SIGTERM: the process exits 143 within 10 s, and a `journal` (when given)
// ends with the job cancelled.
void expect_sigterm_ends(pid_t pid, const std::filesystem::path& journal = {}) {
  auto [secs, status] = sigterm(pid);
  ASSERT_TRUE(status) << "still running 30 s after SIGTERM";
  EXPECT_LT(secs, 10.0);
  ASSERT_TRUE(WIFEXITED(*status)) << *status;
  EXPECT_EQ(WEXITSTATUS(*status), 143);
  if (journal.empty())
    return;
  auto last = last_line(journal);
  EXPECT_NE(last.find("\"to\":\"cancelled\""), std::string::npos) << last;
}

} // namespace

TEST(RunCli, SigtermEndsTheRunWithinTenSecondsWhileItStarts) {
  for (int delay_ms : {0, 150, 600}) {
    test::temp_dir tmp;
    auto cfg = tmp.write("job.yaml", tiny_job(tmp.file("run")));
    auto pid = start({"run", cfg});
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    auto [secs, status] = sigterm(pid);
    ASSERT_TRUE(status) << "still running 30 s after SIGTERM (" << delay_ms << " ms in)";
    EXPECT_LT(secs, 10.0) << delay_ms << " ms in";
    // Before its handler is installed the default action ends it.
    EXPECT_TRUE((WIFEXITED(*status) && WEXITSTATUS(*status) == 143) ||
                (WIFSIGNALED(*status) && WTERMSIG(*status) == SIGTERM))
        << delay_ms << " ms in: status " << *status;
  }
}

TEST(RunCli, SigtermCancelsARunningJobNowAndExitsWith143) {
  test::temp_dir tmp;
  auto cfg = tmp.write("job.yaml", tiny_job(tmp.file("run")));
  auto pid = start({"run", cfg});
  wait_for_file(tmp.path() / "run" / "rl" / "checkpoints" / "latest", pid);
  expect_sigterm_ends(pid, tmp.path() / "run" / "events.jsonl");
}

// The driver waits on a worker that no longer answers (stopped), with the
// run's timeouts far away: SIGTERM still ends the run within its bound, and
// the workers end with it.
TEST(RunCli, SigtermEndsARunStuckOnAFrozenWorkerAndTheWorkersWithIt) {
  test::temp_dir tmp;
  auto cfg = tmp.write("job.yaml", tiny_job(tmp.file("run")) +
                                       "placement:\n"
                                       "  mode: disaggregated\n"
                                       "  pools: [{name: train, devices: 1}, {name: gen, devices: 1}]\n"
                                       "  roles:\n"
                                       "    - {role: policy, pool: train}\n"
                                       "    - {role: critic, pool: train}\n"
                                       "    - {role: rollout, pool: gen}\n"
                                       "    - {role: reward, pool: gen}\n"
                                       "    - {role: reference, pool: gen}\n");
  auto pid = start({"run", cfg});
  wait_for_file(tmp.path() / "run" / "rl" / "checkpoints" / "latest", pid);
  auto workers = children_of(pid);
  ASSERT_FALSE(workers.empty()) << "no worker processes";
  for (auto w : workers)
    ::kill(w, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(300)); // the driver now waits on them
  expect_sigterm_ends(pid);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (auto w : workers) {
    while (!test::process_ended(w) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_TRUE(test::process_ended(w)) << "worker " << w << " outlived troupe run";
  }
}

TEST(DriverCli, SigtermEndsADriverWithinTenSeconds) {
  test::temp_dir tmp;
  std::filesystem::create_directories(tmp.path() / "job");
  tmp.write("job/spec.yaml", tiny_job(tmp.file("run")));
  auto pid = test::start_process(TROUPE_BINARY_PATH, {"driver", "--job-dir", tmp.file("job")},
                                 tmp.file("driver.out"));
  wait_for_file(tmp.path() / "run" / "rl" / "checkpoints" / "latest", pid);
  expect_sigterm_ends(pid, tmp.path() / "run" / "events.jsonl");
}

TEST(WorkerCli, SigtermEndsAWorkerStillLookingForItsDriver) {
  // Port 1 on loopback refuses: the worker keeps retrying its registration.
  auto pid = test::start_process(TROUPE_BINARY_PATH, {"worker", "--driver", "127.0.0.1:1", "--rank", "0",
                                                      "--world", "1", "--timeout-ms", "60000"});
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto [secs, status] = sigterm(pid);
  ASSERT_TRUE(status) << "the worker did not end on SIGTERM";
  EXPECT_LT(secs, 10.0);
}
