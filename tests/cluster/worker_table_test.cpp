// A node agent's workers (cluster/worker_table.hpp), as real processes: a
// worker asked for again while its old process still runs replaces it
// (NOTE [replacing a worker] in cluster/job_nodes.hpp).
#include "cluster/worker_table.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <chrono>
#include <csignal>

using namespace troupe;
using namespace troupe::cluster;

namespace {

// A "worker" that sleeps for its --timeout-ms, in whole seconds (its
// arguments: worker --driver D --rank R --world W --role L --timeout-ms T).
std::string sleeper(const test::temp_dir& dir) {
  auto exe = dir.write("worker.sh", "#!/bin/sh\nexec sleep $((${11} / 1000))\n");
  ::chmod(exe.c_str(), 0755);
  return exe;
}

worker_start start_of(const test::temp_dir& dir, int32_t rank, int64_t sleep_ms = 60000) {
  worker_start s;
  s.job_id = "job-000001";
  s.rank = rank;
  s.world = 2;
  s.label = "policy[" + std::to_string(rank) + "]";
  s.driver = "127.0.0.1:4000";
  s.cwd = dir.path().string();
  s.timeout_ms = sleep_ms;
  return s;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

} // namespace

// The driver told the old process to end and asked for the worker again
// before it had (a loaded node): the old one gets the grace, then is
// killed; the new one starts, and the old one's end is reported once.
TEST(WorkerTable, AWorkerAskedForAgainWhileItRunsIsReplacedAfterTheGrace) {
  test::temp_dir dir;
  worker_table table{sleeper(dir), dir.path().string(), 300};
  ASSERT_FALSE(table.start(start_of(dir, 0)));
  ASSERT_FALSE(table.start(start_of(dir, 1)));
  auto t0 = std::chrono::steady_clock::now();
  auto again = table.start(start_of(dir, 0));
  ASSERT_FALSE(again) << again->description;
  EXPECT_GE(seconds_since(t0), 0.3);
  auto ended = table.reap();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].rank, 0);
  EXPECT_GT(ended[0].pid, 0); // a process that ran: the controller only logs it
  EXPECT_EQ(ended[0].signal, SIGKILL);
  EXPECT_TRUE(table.reap().empty());
  // Both ranks run: the new rank 0 and the untouched rank 1.
  auto stopped = table.stop_all("the test ended");
  ASSERT_EQ(stopped.size(), 2u);
  for (const auto& x : stopped)
    EXPECT_EQ(x.signal, SIGKILL) << x.rank << ": " << x.description;
}

// One that ends by itself within the grace is not killed.
TEST(WorkerTable, AReplacedWorkerThatEndsWithinTheGraceIsNotKilled) {
  test::temp_dir dir;
  worker_table table{sleeper(dir), dir.path().string(), 20000};
  ASSERT_FALSE(table.start(start_of(dir, 0, 1000)));
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_FALSE(table.start(start_of(dir, 0)));
  EXPECT_LT(seconds_since(t0), 10.0);
  auto ended = table.reap();
  ASSERT_EQ(ended.size(), 1u);
  EXPECT_EQ(ended[0].code, 0) << ended[0].description;
  EXPECT_EQ(ended[0].signal, 0) << ended[0].description;
  EXPECT_EQ(table.stop_all("the test ended").size(), 1u);
}

// A start the node cannot take is answered as an exit without a process.
TEST(WorkerTable, AStartItCannotTakeIsAnsweredWithoutAProcess) {
  test::temp_dir dir;
  worker_table table{sleeper(dir), dir.path().string()};
  auto s = start_of(dir, 0);
  s.cwd = dir.file("not-there");
  auto r = table.start(s);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->pid, 0);
  EXPECT_NE(r->description.find("does not exist on this node"), std::string::npos)
      << r->description;
  s = start_of(dir, 0);
  s.rank = 2; // world 2
  r = table.start(s);
  ASSERT_TRUE(r);
  EXPECT_NE(r->description.find("StartWorker.rank"), std::string::npos) << r->description;
  EXPECT_TRUE(table.reap().empty());
}
