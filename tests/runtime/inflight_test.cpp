// NOTE [calls in flight]: a process group's identity is equal on its ranks
// and differs between groups; a blocking call is listed while it runs (with
// its group, rank, size and op) and gone once it returns.
#include "runtime/collectives.hpp"
#include "runtime/inflight.hpp"

#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <future>
#include <optional>
#include <set>
#include <thread>

using namespace troupe;
using namespace troupe::runtime;
using troupe::testing::on_every_rank;

namespace {

local_groups watched_ranks(int world, const std::string& name) {
  group_options go;
  go.name = name;
  go.timeout_ms = 20000;
  auto s = make_local_groups(world, go);
  EXPECT_TRUE(s) << (s ? "" : describe(s.error()));
  return s ? std::move(*s) : local_groups{};
}

// The call of `group` in flight now, if any.
std::optional<call_in_flight> listed_call_of(uint64_t group) {
  for (const auto& c : calls_in_flight(64))
    if (c.group == group)
      return c;
  return std::nullopt;
}

// Waits (up to 10 s) for a call of `group` to be listed.
std::optional<call_in_flight> await_listed_call_of(uint64_t group) {
  for (int i = 0; i < 1000; ++i) {
    if (auto c = listed_call_of(group))
      return c;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return std::nullopt;
}

} // namespace

TEST(CallsInFlight, AGroupsIdentityIsEqualOnItsRanksAndDiffersBetweenGroups) {
  auto a = watched_ranks(2, "watched-a");
  auto b = watched_ranks(2, "watched-b");
  ASSERT_EQ(a.groups.size(), 2u);
  ASSERT_EQ(b.groups.size(), 2u);
  EXPECT_NE(a.groups[0].identity(), 0u);
  EXPECT_EQ(a.groups[0].identity(), a.groups[1].identity());
  EXPECT_EQ(b.groups[0].identity(), b.groups[1].identity());
  EXPECT_NE(a.groups[0].identity(), b.groups[0].identity());
  EXPECT_EQ(process_group{}.identity(), 0u);

  // A mesh's lines: equal along one line, distinct from the world and from
  // the other lines.
  auto c = watched_ranks(4, "watched-mesh");
  ASSERT_EQ(c.groups.size(), 4u);
  const rank_mesh mesh{{2, 2}};
  auto ids = on_every_rank<std::vector<uint64_t>>(c.groups, [&](process_group& world) {
    auto lines = make_mesh_groups(world, mesh, {"dp", "tp"});
    EXPECT_TRUE(lines) << describe(lines.error());
    std::vector<uint64_t> out;
    if (lines)
      for (const auto& g : *lines)
        out.push_back(g.identity());
    return out;
  });
  ASSERT_EQ(ids[0].size(), 2u);
  // Rank r = (r / 2, r % 2): dp lines {0, 2}, {1, 3}; tp lines {0, 1}, {2, 3}.
  EXPECT_EQ(ids[0][0], ids[2][0]);
  EXPECT_EQ(ids[1][0], ids[3][0]);
  EXPECT_EQ(ids[0][1], ids[1][1]);
  EXPECT_EQ(ids[2][1], ids[3][1]);
  const std::set<uint64_t> distinct{ids[0][0], ids[1][0], ids[0][1], ids[2][1],
                                    c.groups[0].identity()};
  EXPECT_EQ(distinct.size(), 5u);
}

TEST(CallsInFlight, ABlockedCollectiveIsListedUntilItReturns) {
  auto s = watched_ranks(2, "watched-barrier");
  ASSERT_EQ(s.groups.size(), 2u);
  const auto id = s.groups[0].identity();
  EXPECT_FALSE(listed_call_of(id));
  // Rank 0 waits in the barrier for rank 1, which has not come yet.
  auto first = std::async(std::launch::async, [&] { return s.groups[0].barrier(); });
  auto c = await_listed_call_of(id);
  ASSERT_TRUE(c) << "rank 0's barrier was not listed";
  EXPECT_EQ(c->rank, 0);
  EXPECT_EQ(c->size, 2);
  EXPECT_EQ(c->op, collective_op::barrier);
  std::this_thread::sleep_for(std::chrono::milliseconds(120));
  c = listed_call_of(id);
  ASSERT_TRUE(c);
  EXPECT_GE(c->age_ms, 100) << "the age counts from the call's start";
  auto second = s.groups[1].barrier();
  EXPECT_TRUE(second) << describe(second.error());
  auto done = first.get();
  EXPECT_TRUE(done) << describe(done.error());
  EXPECT_FALSE(listed_call_of(id)) << "a returned call is no longer listed";
}

TEST(CallsInFlight, AStartedReceivesWaitIsListedAsAWait) {
  auto s = watched_ranks(2, "watched-p2p");
  ASSERT_EQ(s.groups.size(), 2u);
  const auto id = s.groups[1].identity();
  auto in = torch::zeros({4});
  auto started = s.groups[1].start_recv(in, 0, 7);
  ASSERT_TRUE(started) << describe(started.error());
  EXPECT_FALSE(listed_call_of(id)) << "starting a transfer does not block";
  auto waiting = std::async(std::launch::async, [&] { return (*started)->wait(); });
  auto c = await_listed_call_of(id);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->rank, 1);
  EXPECT_EQ(c->op, collective_op::wait);
  auto sent = s.groups[0].send(torch::ones({4}), 1, 7);
  EXPECT_TRUE(sent) << describe(sent.error());
  auto got = waiting.get();
  EXPECT_TRUE(got) << describe(got.error());
  EXPECT_TRUE(torch::equal(in, torch::ones({4})));
  EXPECT_FALSE(listed_call_of(id));
}

TEST(CallsInFlight, TheOldestComeFirstAndAnUnnamedGroupIsNotListed) {
  const auto before = calls_in_flight(64).size();
  {
    const scoped_call unnamed{0, 0, 2, collective_op::all_reduce};
    EXPECT_EQ(calls_in_flight(64).size(), before);
  }
  const auto g1 = group_identity(0, "first"), g2 = group_identity(0, "second");
  EXPECT_NE(g1, g2);
  EXPECT_EQ(g1, group_identity(0, "first"));
  EXPECT_NE(group_identity(g1, "x"), group_identity(g2, "x"));
  std::optional<scoped_call> older;
  older.emplace(g1, 0, 2, collective_op::broadcast);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  {
    const scoped_call newer{g2, 1, 3, collective_op::gather};
    std::vector<call_in_flight> ours;
    for (const auto& c : calls_in_flight(64))
      if (c.group == g1 || c.group == g2)
        ours.push_back(c);
    ASSERT_EQ(ours.size(), 2u);
    EXPECT_EQ(ours[0].group, g1);
    EXPECT_EQ(ours[0].op, collective_op::broadcast);
    EXPECT_EQ(ours[1].group, g2);
    EXPECT_EQ(ours[1].rank, 1);
    EXPECT_EQ(ours[1].size, 3);
    EXPECT_GE(ours[0].age_ms, ours[1].age_ms);
    ASSERT_EQ(calls_in_flight(1).size(), 1u);
    EXPECT_GE(calls_in_flight(1)[0].age_ms, ours[0].age_ms) << "the longest-running one";
  }
  older.reset();
  EXPECT_FALSE(listed_call_of(g1));
  EXPECT_FALSE(listed_call_of(g2));
}

TEST(CallsInFlight, ProgressResetsACallsAge) {
  const auto g = group_identity(0, "progress");
  const scoped_call c{g, 0, 2, collective_op::all_gather};
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  ASSERT_TRUE(listed_call_of(g));
  EXPECT_GE(listed_call_of(g)->age_ms, 80);
  note_progress();
  EXPECT_LT(listed_call_of(g)->age_ms, 80) << "its age counts from the progress";
}

// NOTE [calls in flight]: transfers over 64 MiB move in pieces; what
// arrives is what was sent.
TEST(CallsInFlight, TransfersLargerThanAPieceArriveWhole) {
  auto s = watched_ranks(2, "watched-pieces");
  ASSERT_EQ(s.groups.size(), 2u);
  const int64_t n = (int64_t{64} << 20) / 4 + 12345; // 64 MiB of floats and a bit
  auto sent = torch::arange(n, torch::kFloat);
  auto got = on_every_rank<bool>(s.groups, [&](process_group& g) {
    auto b = g.rank() == 0 ? sent.clone() : torch::zeros({n});
    if (!g.broadcast(b, 0) || !torch::equal(b, sent))
      return false;
    auto r = g.rank() == 0 ? sent.clone() : torch::zeros({n});
    if (g.rank() == 0)
      return static_cast<bool>(g.send(r, 1, 3));
    return g.recv(r, 0, 3) && torch::equal(r, sent);
  });
  EXPECT_TRUE(got[0]);
  EXPECT_TRUE(got[1]);
}
