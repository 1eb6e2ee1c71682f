// NOTE [controller core]: the controller's decisions with made-up facts —
// the legal moves of a job, the order and fit of admission, and what a
// restarted controller does with each record. Time is a parameter.
#include "cluster/controller_core.hpp"

#include <gtest/gtest.h>

#include <map>
#include <set>

using namespace troupe;
using namespace troupe::cluster;

namespace {

using s = ctl_state;

std::vector<s> all_states() {
  std::vector<s> out;
  for (int i = 0; i < ctl_state_count; ++i)
    out.push_back(static_cast<s>(i));
  return out;
}

node_view ready_node(std::string name, int64_t devices) {
  node_view n;
  n.name = std::move(name);
  n.address = n.name + ".example";
  n.state = node_state::ready;
  n.resources.cores = static_cast<int32_t>(devices);
  return n;
}

admission_request local_job(std::string id, int64_t cores) {
  return {std::move(id), cores, {}, actors::rl::launcher_kind::local};
}

} // namespace

TEST(JobBookTransitions, TheEdgesAndNoOthers) {
  const std::set<std::pair<s, s>> edges{
      {s::queued, s::pending},     {s::queued, s::cancelled},    {s::queued, s::failed},
      {s::pending, s::preparing},  {s::pending, s::failed},      {s::pending, s::cancelled},
      {s::pending, s::lost},       {s::preparing, s::running},   {s::preparing, s::failed},
      {s::preparing, s::cancelled}, {s::preparing, s::lost},     {s::running, s::paused},
      {s::running, s::succeeded},  {s::running, s::failed},      {s::running, s::cancelled},
      {s::running, s::lost},       {s::paused, s::running},      {s::paused, s::succeeded},
      {s::paused, s::failed},      {s::paused, s::cancelled},    {s::paused, s::lost},
      {s::failed, s::queued},      {s::cancelled, s::queued},    {s::lost, s::queued}};
  int legal = 0;
  for (auto from : all_states())
    for (auto to : all_states()) {
      bool edge = edges.count({from, to}) > 0;
      EXPECT_EQ(transition_allowed(from, to), edge) << to_string(from) << " -> " << to_string(to);
      // A book in `from` moves exactly along the edges.
      job_book book;
      book.restore(from, {{from, 100, "restored"}});
      EXPECT_EQ(book.move(to, 200, "why"), edge);
      EXPECT_EQ(book.state(), edge ? to : from);
      EXPECT_EQ(book.transitions().size(), edge ? 2u : 1u);
      legal += edge;
    }
  EXPECT_EQ(legal, static_cast<int>(edges.size()));
  EXPECT_FALSE(transition_allowed(s::succeeded, s::queued)) << "a succeeded job is not resumed";
}

TEST(JobBookTransitions, ALifeAndItsReplayAfterARestart) {
  job_book book;
  book.restore(s::queued, {{s::queued, 10, "submitted"}});
  EXPECT_TRUE(book.move(s::pending, 20, "admitted"));
  EXPECT_TRUE(book.move(s::preparing, 30, ""));
  EXPECT_TRUE(book.move(s::running, 40, ""));
  EXPECT_TRUE(book.move(s::paused, 50, "at rl step 2"));
  EXPECT_TRUE(book.move(s::running, 60, "resumed"));
  ASSERT_EQ(book.transitions().size(), 6u);
  // The controller restarts and the job actor replays its journal: the old
  // moves change nothing, a move it missed while down counts.
  for (auto [to, t] : std::vector<std::pair<s, int64_t>>{
           {s::preparing, 30}, {s::running, 40}, {s::paused, 50}, {s::running, 60}})
    EXPECT_FALSE(book.move(to, t, "replayed")) << to_string(to) << " at " << t;
  EXPECT_EQ(book.transitions().size(), 6u);
  EXPECT_TRUE(book.move(s::paused, 70, "paused while the controller was down"));
  EXPECT_TRUE(book.move(s::succeeded, 80, ""));
  EXPECT_EQ(book.state(), s::succeeded);
  EXPECT_EQ(book.transitions().back().time_us, 80);
  // A resumed job's journal holds its first run's end: that end is older.
  job_book resumed;
  resumed.restore(s::failed, {{s::running, 40, ""}, {s::failed, 50, "boom"}});
  EXPECT_TRUE(resumed.move(s::queued, 90, "resumed from its last checkpoint"));
  EXPECT_TRUE(resumed.move(s::pending, 95, "admitted (resuming)"));
  EXPECT_FALSE(resumed.move(s::failed, 50, "boom (replayed)"));
  EXPECT_EQ(resumed.state(), s::pending);
}

TEST(Admission, FirstInFirstOutAndNothingOvertakesTheHead) {
  admission a{8, 2};
  a.enqueue("a"), a.enqueue("b"), a.enqueue("c");
  EXPECT_EQ(a.position("a"), 1);
  EXPECT_EQ(a.position("c"), 3);
  EXPECT_EQ(a.position("zz"), 0);
  // Six of eight cores in use: the head (4 cores) waits, and so do the
  // small ones behind it.
  auto d = a.decide(local_job("a", 4), {{6, {}, {}}}, {});
  EXPECT_FALSE(d.start);
  EXPECT_EQ(d.wait_reason, "waiting for cores on the controller's machine");
  d = a.decide(local_job("a", 4), {{4, {}, {}}}, {});
  EXPECT_TRUE(d.start) << d.wait_reason;
  EXPECT_EQ(d.cores, 4);
  a.remove("a");
  EXPECT_EQ(a.position("b"), 1);
  // A job asking for more cores than the machine has takes all of them.
  d = a.decide(local_job("b", 64), {}, {});
  EXPECT_TRUE(d.start);
  EXPECT_EQ(d.cores, 8);
}

TEST(Admission, TheLimitOnRunningJobsHoldsAndSaysSo) {
  admission a{64, 2};
  auto d = a.decide(local_job("x", 1), {{1, {}, {}}, {1, {}, {}}}, {});
  EXPECT_FALSE(d.start);
  EXPECT_EQ(d.wait_reason, "waiting for one of the 2 running jobs to end");
  EXPECT_TRUE(a.decide(local_job("x", 1), {{1, {}, {}}}, {}).start);
}

TEST(Admission, JobsWithWorkersGoToNodesThatFitOrWaitWithTheReason) {
  admission a{4, 8};
  admission_request big{"big", 16, {2, 2}, actors::rl::launcher_kind::automatic};
  // No node ready: automatic runs the workers on this machine.
  auto d = a.decide(big, {}, {});
  EXPECT_TRUE(d.start);
  EXPECT_FALSE(d.on_nodes);
  EXPECT_EQ(d.cores, 4);
  // With nodes: on them, and the driver alone takes a core here.
  std::vector<node_view> nodes{ready_node("n1", 2), ready_node("n2", 2)};
  d = a.decide(big, {}, nodes);
  ASSERT_TRUE(d.start) << d.wait_reason;
  EXPECT_TRUE(d.on_nodes);
  EXPECT_EQ(d.nodes.size(), 2u);
  EXPECT_EQ(d.cores, 1);
  // A running job holds n1's devices: the head waits for nodes, naming them.
  d = a.decide(big, {{1, {"n1"}, {2}}}, nodes);
  EXPECT_FALSE(d.start);
  EXPECT_NE(d.wait_reason.find("waiting for nodes"), std::string::npos) << d.wait_reason;
  EXPECT_TRUE(d.nodes.empty());
  // launcher: nodes waits for nodes even when none is there.
  d = a.decide({"n", 1, {1}, actors::rl::launcher_kind::nodes}, {}, {});
  EXPECT_FALSE(d.start);
  EXPECT_NE(d.wait_reason.find("waiting for nodes"), std::string::npos) << d.wait_reason;
  // launcher: local never uses them.
  d = a.decide({"l", 2, {1}, actors::rl::launcher_kind::local}, {}, nodes);
  EXPECT_TRUE(d.start);
  EXPECT_FALSE(d.on_nodes);
}

TEST(Recovery, EachRecordStateAgainstEachDriverJsonState) {
  const int64_t pid = 4242;
  struct driver_case {
    const char* what;
    std::optional<driver_info> info;
    bool running;
    /// What a job whose driver had started (pending .. paused) gets.
    recovery_step started;
  };
  const std::vector<driver_case> cases{
      {"no driver.json", std::nullopt, false, recovery_step::settle},
      {"another pid's driver.json", driver_info{4343, 5000}, true, recovery_step::settle},
      {"its driver.json, the process gone (or the pid reused)", driver_info{pid, 5000}, false,
       recovery_step::settle},
      {"its driver.json and its driver running", driver_info{pid, 5000}, true, recovery_step::reattach}};
  const std::map<s, std::optional<recovery_step>> by_state{
      {s::queued, recovery_step::requeue}, {s::pending, std::nullopt},   {s::preparing, std::nullopt},
      {s::running, std::nullopt},          {s::paused, std::nullopt},    {s::succeeded, recovery_step::keep},
      {s::failed, recovery_step::keep},    {s::cancelled, recovery_step::keep}, {s::lost, recovery_step::keep}};
  ASSERT_EQ(by_state.size(), all_states().size());
  for (const auto& [st, fixed] : by_state)
    for (const auto& c : cases) {
      auto step = plan_recovery(st, pid, c.info, c.running);
      EXPECT_EQ(step, fixed.value_or(c.started)) << to_string(st) << ", " << c.what << ": " << to_string(step);
    }
  // A record that never had a driver is not re-attached to pid 0's file.
  EXPECT_EQ(plan_recovery(s::pending, 0, driver_info{0, 1}, true), recovery_step::settle);
}
