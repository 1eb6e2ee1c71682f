// The lean front (NOTE [lean client] in apps/cli.hpp): `troupe` never loads
// LibTorch, lists every command, runs the client commands itself and hands
// the engine's commands to troupe-engine in the same process.
#include "tests/support/process.hpp"

#include <gtest/gtest.h>

#include <string>

namespace {

const std::string troupe = TROUPE_BINARY_PATH;

TEST(TroupeFront, DoesNotLinkLibTorch) {
  int status = -1;
  auto libs = troupe::test::run_command("ldd '" + troupe + "'", status);
  ASSERT_EQ(status, 0) << libs;
  EXPECT_NE(libs.find("libgrpc++"), std::string::npos) << libs; // it is the client
  for (const char* lib : {"libtorch", "libc10", "libgloo", "libopenblas", "libcudart"})
    EXPECT_EQ(libs.find(lib), std::string::npos) << lib << " in\n" << libs;
}

TEST(TroupeFront, HelpListsClientAndEngineCommands) {
  int status = -1;
  auto help = troupe::test::run_command("'" + troupe + "' --help", status);
  ASSERT_EQ(status, 0) << help;
  for (const char* cmd : {"submit", "jobs", "status", "watch", "logs", "cancel", "pause", "resume",
                          "set", "nodes", "run", "plan", "generate", "tokenize", "controller", "node",
                          "slurm", "worker", "driver", "env"})
    EXPECT_NE(help.find(std::string{"\n  "} + cmd + " "), std::string::npos) << cmd << "\n" << help;
  EXPECT_EQ(help.find("_gloo-smoke"), std::string::npos) << help;
  auto version = troupe::test::run_command("'" + troupe + "' --version", status);
  EXPECT_EQ(status, 0);
  EXPECT_EQ(version.rfind("troupe ", 0), 0u) << version;
}

TEST(TroupeFront, EngineCommandsRunInTheEngineWithTheirOwnHelpAndErrors) {
  int status = -1;
  // The engine's own parser answers: its subcommand's help and its errors.
  auto help = troupe::test::run_command("'" + troupe + "' run --help 2>&1", status);
  EXPECT_EQ(status, 0) << help;
  EXPECT_NE(help.find("--resume"), std::string::npos) << help;
  auto bad = troupe::test::run_command("'" + troupe + "' env --no-such-flag 2>&1", status);
  EXPECT_NE(status, 0);
  EXPECT_NE(bad.find("no-such-flag"), std::string::npos) << bad;
  // A client command with a bad flag is refused by the front itself.
  bad = troupe::test::run_command("'" + troupe + "' jobs --no-such-flag 2>&1", status);
  EXPECT_NE(status, 0);
  EXPECT_NE(bad.find("no-such-flag"), std::string::npos) << bad;
}

} // namespace
