// NOTE [heartbeats] and NOTE [deadlocked collectives]: the datagram's two
// forms round-trip, anything else is refused whole, and the watchdog's rule
// finds a group only when every one of its ranks is in one of its calls for
// the threshold.
#include "cluster/heartbeats.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace troupe;
using namespace troupe::cluster;
using runtime::call_in_flight;
using runtime::collective_op;

namespace {

std::optional<heartbeat> decode(const std::string& s) {
  return decode_heartbeat(s.data(), s.size());
}

call_in_flight call(uint64_t group, int rank, int size, int64_t age_ms,
                    collective_op op = collective_op::all_reduce) {
  return {group, rank, size, op, age_ms};
}

} // namespace

TEST(Heartbeats, BothFormsRoundTrip) {
  heartbeat plain{3, 4242, {}};
  const auto bytes = encode_heartbeat(plain);
  EXPECT_EQ(bytes.size(), 16u) << "a heartbeat without calls keeps the first form";
  auto back = decode(bytes);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->rank, 3);
  EXPECT_EQ(back->pid, 4242);
  EXPECT_TRUE(back->calls.empty());

  heartbeat busy{1,
                 77,
                 {call(0xfeedbeefcafe, 1, 2, 5000, collective_op::reduce_scatter),
                  call(9, 0, 4, 0, collective_op::wait)}};
  auto b = decode(encode_heartbeat(busy));
  ASSERT_TRUE(b);
  EXPECT_EQ(b->rank, 1);
  EXPECT_EQ(b->pid, 77);
  EXPECT_EQ(b->calls, busy.calls);
}

TEST(Heartbeats, AtMostMaxCallsTravel) {
  heartbeat h{0, 1, {}};
  for (int i = 0; i < 20; ++i)
    h.calls.push_back(call(100 + static_cast<uint64_t>(i), 0, 2, 1000 - i));
  auto b = decode(encode_heartbeat(h));
  ASSERT_TRUE(b);
  ASSERT_EQ(b->calls.size(), heartbeat::max_calls);
  EXPECT_EQ(b->calls.front().group, 100u) << "the first (oldest) ones";
}

TEST(Heartbeats, AnythingElseIsRefusedWhole) {
  const auto good = encode_heartbeat({2, 99, {call(5, 1, 2, 10)}});
  ASSERT_TRUE(decode(good));
  EXPECT_FALSE(decode(""));
  EXPECT_FALSE(decode(good.substr(0, 15)));
  EXPECT_FALSE(decode(good.substr(0, good.size() - 1))) << "a call cut short";
  EXPECT_FALSE(decode(good + "x")) << "a trailing byte";
  EXPECT_FALSE(decode(encode_heartbeat({2, 99, {}}) + "x")) << "the first form is 16 bytes";
  auto patched = [&](size_t at, unsigned char v) {
    auto s = good;
    s[at] = static_cast<char>(v);
    return decode(s);
  };
  EXPECT_FALSE(patched(0, 'x')) << "not the magic";
  EXPECT_FALSE(patched(4, 0x80)) << "a negative rank";
  EXPECT_FALSE(patched(19, 0)) << "a count of 0";
  EXPECT_FALSE(patched(19, 2)) << "a count the length does not hold";
  EXPECT_FALSE(patched(19, 200)) << "a count over max_calls";
  // The call: group 20..27, rank 28..31, size 32..35, age 36..39, op 40..43.
  EXPECT_FALSE(patched(27, 0)) << "group 0 (the only set byte of 5 cleared)";
  EXPECT_FALSE(patched(31, 2)) << "rank 2 of a group of 2";
  EXPECT_FALSE(patched(35, 0)) << "a group of 0 ranks";
  EXPECT_FALSE(patched(43, 13)) << "no such op";
  EXPECT_TRUE(patched(43, 12)) << "the last op (split)";
  // A pid of 0 in either form.
  EXPECT_FALSE(decode(encode_heartbeat({2, 0, {}})));
  EXPECT_FALSE(decode(encode_heartbeat({2, 0, {call(5, 1, 2, 10)}})));
}

TEST(Deadlocks, EveryRankInTheGroupsCallForTheThreshold) {
  // Group 7: ranks 0 and 1 on workers 2 and 5, both stuck.
  const std::vector<worker_calls> stuck = {{2, {call(7, 0, 2, 5000)}},
                                           {5, {call(7, 1, 2, 2100, collective_op::broadcast)}}};
  auto found = find_deadlocks(stuck, 2000);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].group, 7u);
  ASSERT_EQ(found[0].ranks.size(), 2u);
  EXPECT_EQ(found[0].ranks[0].worker, 2);
  EXPECT_EQ(found[0].ranks[1].worker, 5);
  EXPECT_EQ(found[0].ranks[1].op, collective_op::broadcast);
  EXPECT_EQ(found[0].stuck_ms(), 2100) << "as long as its last rank has been in it";
  const auto why = found[0].describe();
  EXPECT_NE(why.find(">= 2100 ms"), std::string::npos) << why;
  EXPECT_NE(why.find("rank 1 in broadcast on worker 5"), std::string::npos) << why;
}

TEST(Deadlocks, ARankStillComingOrElsewhereIsNoDeadlock) {
  // Rank 1 joined 500 ms ago: the call may yet finish.
  EXPECT_TRUE(
      find_deadlocks({{0, {call(7, 0, 2, 9000)}}, {1, {call(7, 1, 2, 500)}}}, 2000).empty());
  // Rank 1 is not in the call (it computes, or waits in another group's).
  EXPECT_TRUE(
      find_deadlocks({{0, {call(7, 0, 2, 9000)}}, {1, {call(8, 0, 2, 9000)}}}, 2000).empty());
  // Two reports of rank 0 are not rank 1's.
  EXPECT_TRUE(
      find_deadlocks({{0, {call(7, 0, 2, 9000)}}, {1, {call(7, 0, 2, 9000)}}}, 2000).empty());
  // Sizes that disagree are not one group's.
  EXPECT_TRUE(
      find_deadlocks({{0, {call(7, 0, 2, 9000)}}, {1, {call(7, 1, 3, 9000)}}}, 2000).empty());
  // A report at another size does not hide the group's ranks at its own.
  EXPECT_EQ(find_deadlocks(
                {{0, {call(7, 0, 3, 9000), call(7, 0, 2, 9000)}}, {1, {call(7, 1, 2, 9000)}}}, 2000)
                .size(),
            1u);
  EXPECT_TRUE(find_deadlocks({}, 2000).empty());
}

TEST(Deadlocks, EachStuckGroupIsFoundOnceAmongOthers) {
  // Worker 0 holds ranks of two groups (a DP and a TP line, say); group 9
  // is whole and stuck, group 7 is missing its rank 2.
  const std::vector<worker_calls> w = {
      {0, {call(7, 0, 3, 8000), call(9, 0, 2, 6000)}},
      {1, {call(9, 1, 2, 4000), call(7, 1, 3, 8000)}},
      {2, {}},
  };
  auto found = find_deadlocks(w, 2000);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].group, 9u);
  EXPECT_EQ(found[0].stuck_ms(), 4000);
  // A one-rank group waits for no one (and a forged report of one kills no one).
  EXPECT_TRUE(find_deadlocks({{3, {call(11, 0, 1, 3000)}}}, 2000).empty());
}
