// The controller's node table (NOTE [node membership]) with a clock of the
// test's own: joins, heartbeats, silence, broken streams, leaving, names.

#include "cluster/node_registry.hpp"

#include <gtest/gtest.h>

using namespace troupe;
using namespace troupe::cluster;

namespace {

node_hello hello(const std::string& name, const std::string& advertise = {}) {
  node_hello h;
  h.name = name;
  h.advertise_host = advertise;
  h.resources = {4, 8LL << 30, 1};
  h.pid = 42;
  return h;
}

constexpr int64_t ms = 1000;

} // namespace

TEST(NodeRegistry, ANodeIsReadyWhileItHeartbeatsAndLostWhenSilent) {
  node_registry r{{100, 1000}};
  std::vector<std::string> closed, lost, joined;
  r.on_lost([&](const node_view& v) { lost.push_back(v.name + ": " + v.reason); });
  // Joins are news too (a queued job may fit now), told with the lock free.
  r.on_joined([&](const node_view& v) {
    joined.push_back(v.name + " " + to_string(v.state).data());
    EXPECT_TRUE(r.find(v.name)) << "the registry is usable from a listener";
  });
  auto id = r.join(hello("a"), "ipv4:10.0.0.2:4000", [&](const std::string& why) { closed.push_back(why); }, 0);
  ASSERT_TRUE(id);
  EXPECT_EQ(joined, std::vector<std::string>{"a ready"});
  auto v = r.find("a");
  ASSERT_TRUE(v);
  EXPECT_EQ(v->state, node_state::ready);
  EXPECT_EQ(v->address, "10.0.0.2") << "the peer's host when none is advertised";
  EXPECT_EQ(v->resources.cores, 4);

  r.heartbeat(*id, 900 * ms);
  EXPECT_TRUE(r.sweep(1800 * ms).empty()) << "900 ms since the last heartbeat";
  EXPECT_EQ(r.sweep(1900 * ms), std::vector<std::string>{"a"});
  EXPECT_EQ(r.find("a")->state, node_state::lost);
  EXPECT_EQ(r.find("a")->reason, "no heartbeat for 1000 ms");
  EXPECT_EQ(r.find("a")->state_time_us, 1900 * ms) << "when it was found lost";
  ASSERT_EQ(closed.size(), 1u) << "its stream is ended";
  EXPECT_EQ(lost, std::vector<std::string>{"a: no heartbeat for 1000 ms"});
  EXPECT_TRUE(r.sweep(5000 * ms).empty()) << "lost once";
  r.heartbeat(*id, 5000 * ms);
  EXPECT_EQ(r.find("a")->state, node_state::lost) << "a late heartbeat of the old session changes nothing";
}

TEST(NodeRegistry, ABrokenStreamLosesTheNodeAndLeavingDoesNot) {
  node_registry r;
  int lost = 0, closed = 0;
  r.on_lost([&](const node_view&) { ++lost; });
  auto a = r.join(hello("a"), "ipv4:127.0.0.1:1", [&](const std::string&) { ++closed; }, 0);
  auto b = r.join(hello("b", "b.example"), "ipv4:127.0.0.1:2", [&](const std::string&) { ++closed; }, 0);
  ASSERT_TRUE(a && b);
  r.disconnected(*a, "its agent's connection closed", 10);
  EXPECT_EQ(r.find("a")->state, node_state::lost);
  EXPECT_EQ(closed, 0) << "a stream that ended is not ended again";
  r.leave(*b, "stopped", 10);
  r.disconnected(*b, "its agent's connection closed", 20);
  EXPECT_EQ(r.find("b")->state, node_state::left);
  EXPECT_EQ(r.find("b")->address, "b.example");
  EXPECT_EQ(lost, 1);
}

TEST(NodeRegistry, NamesAreUniqueAmongReadyNodesAndChecked) {
  node_registry r;
  auto first = r.join(hello("gpu-0"), "ipv4:10.0.0.1:1", nullptr, 0);
  ASSERT_TRUE(first);
  auto twin = r.join(hello("gpu-0"), "ipv4:10.0.0.9:1", nullptr, 0);
  ASSERT_FALSE(twin);
  EXPECT_NE(describe(twin.error()).find("already joined"), std::string::npos);
  EXPECT_EQ(r.find("gpu-0")->peer, "ipv4:10.0.0.1:1");
  r.disconnected(*first, "gone", 1);
  auto again = r.join(hello("gpu-0"), "ipv4:10.0.0.9:1", nullptr, 2);
  ASSERT_TRUE(again) << "a lost node's name is free";
  EXPECT_NE(*again, *first) << "a new session";
  r.heartbeat(*first, 3);
  EXPECT_EQ(r.find("gpu-0")->last_heartbeat_us, 2) << "the old session's heartbeat is not the new one's";

  for (const std::string& bad : std::vector<std::string>{"", "a/b", "a b", "x;rm", std::string(64, 'n')})
    EXPECT_FALSE(r.join(hello(bad), "ipv4:10.0.0.1:1", nullptr, 0)) << bad;
  EXPECT_FALSE(r.join(hello("c", "host; rm -rf /"), "ipv4:10.0.0.1:1", nullptr, 0));
  EXPECT_FALSE(r.join(hello("d"), "unix:/tmp/sock", nullptr, 0)) << "no address to reach it at";
  EXPECT_EQ(r.list().size(), 1u);
}

TEST(NodeRegistry, PeersGiveTheirHosts) {
  EXPECT_EQ(host_of_peer("ipv4:10.0.0.2:41234"), "10.0.0.2");
  EXPECT_EQ(host_of_peer("ipv6:[::1]:5000"), "::1");
  EXPECT_EQ(host_of_peer("ipv6:[fe80::1%eth0]:5000"), "fe80::1%eth0");
  EXPECT_EQ(host_of_peer("unix:/tmp/x"), "");
  EXPECT_EQ(host_of_peer("garbage"), "");
}
