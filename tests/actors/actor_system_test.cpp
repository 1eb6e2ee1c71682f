#include "actors/actor_system.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>

using namespace troupe;

TEST(ActorSystem, RoundTripsAreMeasuredAndSorted) {
  caf::actor_system_config cfg;
  actors::configure(cfg);
  caf::actor_system sys{cfg};
  auto rt = actors::measure_round_trip(sys, 200, 5000);
  ASSERT_TRUE(rt) << describe(rt.error());
  ASSERT_EQ(rt->size(), 200u);
  EXPECT_TRUE(std::is_sorted(rt->begin(), rt->end()));
  EXPECT_GT(rt->front(), 0.0);
  EXPECT_FALSE(actors::measure_round_trip(sys, 0, 5000));
}

TEST(ActorSystem, RendersTroupeErrorsByName) {
  caf::actor_system_config cfg;
  actors::configure(cfg);
  caf::actor_system sys{cfg};
  auto err = make_error(errc::timeout, "policy.update after 30000 ms");
  EXPECT_EQ(sys.render(err), "timeout: policy.update after 30000 ms");
}
