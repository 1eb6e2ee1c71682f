// Runs the real `troupe env` binary: versions are reported and the 2-process
// gloo all-reduce smoke test passes on loopback.
#include "tests/support/process.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <string>

using troupe::test::run_command;

namespace {

std::string binary() {
  return TROUPE_BINARY_PATH;
}

} // namespace

TEST(TroupeEnv, JsonReportWithPassingSmokeTests) {
  int status = -1;
  auto out = run_command(binary() + " env --json --world 3 --timeout-ms 60000", status);
  ASSERT_EQ(status, 0) << out;
  auto j = nlohmann::json::parse(out);
  EXPECT_FALSE(j["libtorch_version"].get<std::string>().empty());
  EXPECT_EQ(j["caf_version"], "0.17.6");
  EXPECT_FALSE(j["grpc_version"].get<std::string>().empty());
  auto backends = j["c10d_backends"];
  EXPECT_NE(std::find(backends.begin(), backends.end(), "gloo"), backends.end());
  EXPECT_TRUE(j["actor_round_trip"]["ok"].get<bool>()) << out;
  EXPECT_TRUE(j["gloo_all_reduce"]["ok"].get<bool>()) << out;
  EXPECT_NE(j["gloo_all_reduce"]["detail"].get<std::string>().find("3 processes"),
            std::string::npos);
}

TEST(TroupeEnv, BadArgumentIsRejected) {
  int status = -1;
  auto out = run_command(binary() + " env --world 1 2>&1", status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("--world"), std::string::npos) << out;
}
