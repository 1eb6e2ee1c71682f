#include "cluster/local_launcher.hpp"
#include "tests/support/temp_dir.hpp"

#include "runtime/file_io.hpp"

#include <gtest/gtest.h>

#include <csignal>

#include <pthread.h>

using namespace troupe;
using namespace troupe::cluster;

TEST(LocalProcess, ReportsExitCodeAndOutput) {
  test::temp_dir dir;
  process_spec spec{"shell", {"/bin/sh", "-c", "echo hello-$TROUPE_X; exit 3"},
                    {{"TROUPE_X", "42"}}, dir.file("out.log")};
  auto p = local_process::spawn(spec);
  ASSERT_TRUE(p) << describe(p.error());
  auto st = p->wait_for(10000);
  ASSERT_TRUE(st) << describe(st.error());
  EXPECT_EQ(st->code, 3);
  EXPECT_EQ(st->describe(), "exited with status 3");
  EXPECT_EQ(*runtime::read_file(dir.file("out.log")), "hello-42\n");
}

// A controller or node agent blocks SIGINT / SIGTERM (for sigwait) and
// ignores SIGPIPE; what it starts must see stop signals all the same.
TEST(LocalProcess, AChildStartsWithDefaultSignalHandlingWhateverItsParentBlocks) {
  test::temp_dir dir;
  sigset_t stop, before;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &stop, &before), 0);
  auto old_pipe = std::signal(SIGPIPE, SIG_IGN);
  auto p = local_process::spawn({"status", {"/bin/sh", "-c", "grep -E '^Sig(Blk|Ign)' /proc/self/status"},
                                 {}, dir.file("out.log")});
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  std::signal(SIGPIPE, old_pipe);
  ASSERT_TRUE(p) << describe(p.error());
  ASSERT_TRUE(p->wait_for(10000));
  auto out = *runtime::read_file(dir.file("out.log"));
  auto mask_of = [&](const std::string& key) {
    auto at = out.find(key + ":");
    EXPECT_NE(at, std::string::npos) << out;
    return at == std::string::npos ? ~0ull : std::stoull(out.substr(at + key.size() + 1), nullptr, 16);
  };
  auto bit = [](int sig) { return 1ull << (sig - 1); };
  EXPECT_EQ(mask_of("SigBlk") & (bit(SIGINT) | bit(SIGTERM)), 0u) << out;
  EXPECT_EQ(mask_of("SigIgn") & (bit(SIGINT) | bit(SIGTERM) | bit(SIGPIPE)), 0u) << out;

  // And so a blocked parent's child ends on SIGTERM.
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &stop, &before), 0);
  auto sleeper = local_process::spawn({"sleeper", {"/bin/sleep", "30"}, {}, {}});
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
  ASSERT_TRUE(sleeper);
  sleeper->kill(SIGTERM);
  auto st = sleeper->wait_for(10000);
  ASSERT_TRUE(st) << "SIGTERM did not end the child";
  EXPECT_EQ(st->signal, SIGTERM);
}

TEST(LocalProcess, MissingExecutableIsAClearError) {
  auto p = local_process::spawn({"ghost", {"/nonexistent/troupe-worker"}, {}, {}});
  ASSERT_FALSE(p);
  EXPECT_EQ(code_of(p.error()), errc::io_error);
  EXPECT_NE(describe(p.error()).find("ghost: cannot execute /nonexistent/troupe-worker"),
            std::string::npos)
    << describe(p.error());
}

TEST(LocalProcess, WaitTimesOutThenKillReportsSignal) {
  auto p = local_process::spawn({"sleeper", {"/bin/sleep", "30"}, {}, {}});
  ASSERT_TRUE(p);
  auto st = p->wait_for(50);
  ASSERT_FALSE(st);
  EXPECT_EQ(code_of(st.error()), errc::timeout);
  p->kill(SIGKILL);
  auto killed = p->wait_for(10000);
  ASSERT_TRUE(killed);
  EXPECT_EQ(killed->signal, SIGKILL);
  EXPECT_FALSE(killed->ok());
}

TEST(LocalProcess, WaitAllNamesTheFailedProcessAndKillsTheRest) {
  std::vector<local_process> procs;
  procs.push_back(std::move(*local_process::spawn({"worker 0", {"/bin/sleep", "30"}, {}, {}})));
  procs.push_back(std::move(*local_process::spawn({"worker 1", {"/bin/sh", "-c", "exit 7"}, {}, {}})));
  auto r = wait_all(procs, 10000);
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::process_failed);
  EXPECT_EQ(describe(r.error()), "process_failed: worker 1 exited with status 7");
  auto st0 = procs[0].wait_for(10000);
  ASSERT_TRUE(st0);
  EXPECT_EQ(st0->signal, SIGKILL);
}
