// The controller's enums through their name tables (NOTE [enum names]):
// job and node states, the shutdown policy, and the controller file's
// on_shutdown choice.
#include "cluster/controller.hpp"
#include "cluster/controller_config.hpp"
#include "cluster/node_registry.hpp"

#include <gtest/gtest.h>

#include <set>

using namespace troupe;
using namespace troupe::cluster;

namespace {

template <class E>
void expect_round_trip(const char* what) {
  std::set<std::string_view> seen;
  for (size_t i = 0; i < enum_count<E>(); ++i) {
    auto e = static_cast<E>(i);
    EXPECT_NE(enum_name(e), "?") << what << " " << i;
    EXPECT_TRUE(seen.insert(enum_name(e)).second) << what;
    EXPECT_EQ(enum_from_name<E>(enum_name(e)), e) << what;
  }
  EXPECT_EQ(enum_name(static_cast<E>(enum_count<E>())), "?") << what;
}

} // namespace

TEST(EnumNames, ControllerEnumsRoundTripThroughTheirNames) {
  expect_round_trip<ctl_state>("ctl_state");
  expect_round_trip<node_state>("node_state");
  expect_round_trip<shutdown_policy>("shutdown_policy");
  EXPECT_EQ(ctl_state_count, 9);
  // The job actor's states keep their names in the controller's vocabulary.
  for (size_t i = 0; i < enum_count<actors::job::job_state>(); ++i) {
    auto s = static_cast<actors::job::job_state>(i);
    EXPECT_EQ(to_string(ctl_state_of(s)), to_string(s));
  }
}
