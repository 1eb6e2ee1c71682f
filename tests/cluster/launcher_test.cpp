#include "cluster/local_launcher.hpp"
#include "tests/support/temp_dir.hpp"

#include "runtime/file_io.hpp"

#include <gtest/gtest.h>

#include <csignal>

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
