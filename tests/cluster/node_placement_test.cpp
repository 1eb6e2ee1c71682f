// Which ready node plays each node of a plan (NOTE [node slots]), what a
// controller and a driver exchange for a job on nodes (nodes.json, the
// driver link's worker request), and the checks an agent makes before it
// runs a StartWorker from the wire.
#include "cluster/driver_link.hpp"
#include "cluster/heartbeats.hpp"
#include "cluster/job_nodes.hpp"
#include "cluster/node_placement.hpp"
#include "cluster/workers.hpp"
#include "tests/support/caf_round_trip.hpp"
#include "tests/support/temp_dir.hpp"

#include "runtime/file_io.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/all.hpp>
#include <gtest/gtest.h>

#include <future>
#include <thread>

using namespace troupe;
using namespace troupe::cluster;

namespace {

node_view node(const std::string& name, int cores, int gpus = 0, node_state state = node_state::ready) {
  node_view v;
  v.name = name;
  v.state = state;
  v.address = "10.0.0.1";
  v.resources.cores = cores;
  v.resources.gpus = gpus;
  return v;
}

} // namespace

TEST(NodePlacement, ADeviceIsAGpuOrOnACpuMachineACore) {
  EXPECT_EQ(device_slots({16, 0, 8}), 8);
  EXPECT_EQ(device_slots({4, 0, 0}), 4);
  EXPECT_EQ(device_slots({0, 0, 0}), 1);
}

TEST(NodePlacement, EachNodeOfThePlanGetsADistinctReadyNodeThatFitsIt) {
  std::vector<node_view> nodes{node("a", 2), node("b", 4), node("c", 8, 0, node_state::lost), node("d", 1)};
  auto got = assign_nodes({2, 1}, nodes, {});
  ASSERT_TRUE(got) << describe(got.error());
  // The larger need first, each on the tightest fit: 2 on a (2 free), 1 on d.
  EXPECT_EQ(*got, (std::vector<std::string>{"a", "d"}));
  // Devices held by running jobs count.
  got = assign_nodes({2, 1}, nodes, {{"a", 1}});
  ASSERT_TRUE(got) << describe(got.error());
  EXPECT_EQ(*got, (std::vector<std::string>{"b", "a"})) << "a's 1 free device fits as tightly as d's: by name";
  // A node is never two of the plan's nodes, even with room for both.
  got = assign_nodes({1, 1}, {node("big", 64)}, {});
  ASSERT_FALSE(got);
  EXPECT_EQ(context_of(got.error()),
            "waiting for nodes: the plan needs 2 nodes with 1, 1 free devices; ready: big (64 of 64 free)");
  got = assign_nodes({3}, nodes, {{"b", 2}});
  ASSERT_FALSE(got);
  EXPECT_EQ(context_of(got.error()), "waiting for nodes: the plan needs 1 node with 3 free devices; ready: a (2 "
                                     "of 2 free), b (2 of 4 free), d (1 of 1 free)")
      << "the lost node is not offered";
  got = assign_nodes({1}, {}, {});
  ASSERT_FALSE(got);
  EXPECT_NE(context_of(got.error()).find("ready: none"), std::string::npos);
}

// NOTE [replacing a worker]: a lost worker's node plays its plan node
// again while it is ready; else a node the job does not use, with room.
TEST(NodePlacement, ALostWorkerGoesBackToItsNodeOrToAFreeNodeTheJobDoesNotUse) {
  const std::vector<std::string> job{"a", "b"};
  const std::vector<int64_t> need{2, 2};
  // b is ready: its process died, not the node.
  auto got = replacement_node(job, need, 1, {node("a", 2), node("b", 2), node("c", 4)}, {});
  ASSERT_TRUE(got) << describe(got.error());
  EXPECT_EQ(*got, "b");
  // b is lost: c (free) takes its place, never a (the job's other node).
  std::vector<node_view> nodes{node("a", 8), node("b", 2, 0, node_state::lost), node("c", 4),
                               node("d", 2)};
  got = replacement_node(job, need, 1, nodes, {});
  ASSERT_TRUE(got) << describe(got.error());
  EXPECT_EQ(*got, "d") << "the tightest fit";
  got = replacement_node(job, need, 1, nodes, {{"d", 1}});
  ASSERT_TRUE(got) << describe(got.error());
  EXPECT_EQ(*got, "c") << "other jobs' devices count";
  // None fits: why, naming the lost node.
  got = replacement_node(job, need, 1,
                         {node("a", 8), node("b", 2, 0, node_state::lost), node("c", 1)}, {});
  ASSERT_FALSE(got);
  EXPECT_EQ(context_of(got.error()), "node b is not ready and no other node can take its place "
                                     "(waiting for nodes: the plan needs 1 node "
                                     "with 2 free devices; ready: c (1 of 1 free))");
  EXPECT_FALSE(replacement_node(job, need, 2, nodes, {})) << "no node 2 in the plan";
}

TEST(JobNodes, TheControllersChoiceAndTheDriversRequestRoundTrip) {
  test::temp_dir tmp;
  auto dir = tmp.path().string();
  ASSERT_TRUE(write_job_nodes(dir, {"10.1.0.1", {{"a", "10.1.0.2"}, {"b", "10.1.0.3"}}}));
  auto n = read_job_nodes(dir);
  ASSERT_TRUE(n) << describe(n.error());
  EXPECT_EQ(n->bind_host, "10.1.0.1");
  ASSERT_EQ(n->nodes.size(), 2u);
  EXPECT_EQ(n->nodes[1].name, "b");
  EXPECT_EQ(n->nodes[1].host, "10.1.0.3");

  // The driver's request crosses the driver link as a CAF message.
  worker_request_file w{42,
                        "10.1.0.1:5000",
                        "/srv/jobs",
                        30000,
                        {{0, 0, "train:policy", false}, {1, 1, "gen:rollout", true}}};
  caf::actor_system_config cfg;
  configure_network(cfg);
  caf::actor_system sys{cfg};
  auto r = test::round_trip(sys, w);
  EXPECT_EQ(r.pid, 42);
  EXPECT_EQ(r.driver, "10.1.0.1:5000");
  EXPECT_EQ(r.timeout_ms, 30000);
  ASSERT_EQ(r.workers.size(), 2u);
  EXPECT_EQ(r.workers[1].node, 1);
  EXPECT_EQ(r.workers[1].label, "gen:rollout");
  EXPECT_FALSE(r.workers[0].restartable);
  EXPECT_TRUE(r.workers[1].restartable);
  EXPECT_TRUE(check_worker_requests(r));

  // NOTE [replacing a worker]: the driver's ask and the controller's answer.
  auto back = test::round_trip(sys, worker_replaced{3, "host-3", "10.1.0.4", ""});
  EXPECT_EQ(back.rank, 3);
  EXPECT_EQ(back.node, "host-3");
  EXPECT_EQ(back.host, "10.1.0.4");
  EXPECT_EQ(back.error, "");

  // Workers out of rank order are refused, naming the entry.
  r.workers[0].rank = 1;
  auto bad = check_worker_requests(r);
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("workers[0]: rank 1 out of order"), std::string::npos) << describe(bad.error());
  ASSERT_TRUE(runtime::write_file_atomic(dir + "/" + nodes_file, "[1, 2"));
  EXPECT_FALSE(read_job_nodes(dir));
}

// NOTE [replacing a worker]: the driver's ask waits at its front until a
// controller takes it and answers; an ask taken by a controller that went
// away without answering (it restarted) goes to the next one.
TEST(DriverLink, AWorkerAskedForAgainWaitsForTheControllersAnswer) {
  caf::actor_system_config cfg;
  configure_network(cfg);
  caf::actor_system sys{cfg};
  auto front = spawn_driver_front(sys);
  auto take = [&](caf::scoped_actor& controller) {
    worker_entry x;
    x.rank = -1;
    controller->request(front, std::chrono::seconds(10), replace_worker_atom::value)
        .receive([&](const worker_entry& got) { x = got; },
                 [&](caf::error& e) { ADD_FAILURE() << sys.render(e); });
    return x;
  };
  auto driver = std::async(std::launch::async, [&] {
    return ask_for_worker_again(sys, front, {2, 1, "gen:rollout", true});
  });
  {
    caf::scoped_actor first{sys};
    auto x = take(first);
    EXPECT_EQ(x.rank, 2);
    EXPECT_EQ(x.node, 1);
    EXPECT_EQ(x.label, "gen:rollout");
  }
  EXPECT_EQ(driver.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "not answered yet";
  caf::scoped_actor second{sys};
  EXPECT_EQ(take(second).rank, 2) << "handed to the next controller";
  caf::anon_send(front, replace_worker_atom::value, worker_replaced{2, "host-3", "10.0.0.9", ""});
  ASSERT_EQ(driver.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  auto got = driver.get();
  ASSERT_TRUE(got) << describe(got.error());
  EXPECT_EQ(got->name, "host-3");
  EXPECT_EQ(got->host, "10.0.0.9");

  // A refusal is the driver's error.
  auto refused = std::async(std::launch::async, [&] {
    return ask_for_worker_again(sys, front, {1, 0, "train:policy", false});
  });
  EXPECT_EQ(take(second).rank, 1);
  caf::anon_send(front, replace_worker_atom::value, worker_replaced{1, "", "", "no node has room"});
  ASSERT_EQ(refused.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  auto r = refused.get();
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("cannot start worker 1 again: no node has room"),
            std::string::npos)
      << describe(r.error());
  caf::anon_send_exit(front, caf::exit_reason::user_shutdown);
}

// NOTE [heartbeats]: a worker's heartbeats reach the driver's receiver as
// datagrams; anything else that arrives there is ignored.
TEST(Heartbeats, TheDriverHearsAWorkersBeatsAndNothingElse) {
  auto wire = encode_heartbeat({3, 4242});
  ASSERT_EQ(wire.size(), 16u);
  auto h = decode_heartbeat(wire.data(), wire.size());
  ASSERT_TRUE(h);
  EXPECT_EQ(h->rank, 3);
  EXPECT_EQ(h->pid, 4242);
  EXPECT_FALSE(decode_heartbeat(wire.data(), wire.size() - 1));
  auto bad = wire;
  bad[0] ^= 1;
  EXPECT_FALSE(decode_heartbeat(bad.data(), bad.size())) << "not our magic";
  auto negative = encode_heartbeat({-1, 4242});
  EXPECT_FALSE(decode_heartbeat(negative.data(), negative.size()));

  auto receiver = heartbeat_receiver::open("127.0.0.1");
  ASSERT_TRUE(receiver) << describe(receiver.error());
  EXPECT_GT(receiver->port(), 0);
  EXPECT_TRUE(receiver->drain().empty());
  ASSERT_TRUE(
      start_heartbeats("127.0.0.1", receiver->port(), {2, 77}, std::chrono::milliseconds(5)));
  std::vector<heartbeat> got;
  for (int i = 0; i < 400 && got.size() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (const auto& b : receiver->drain())
      got.push_back(b);
  }
  ASSERT_GE(got.size(), 3u);
  EXPECT_EQ(got[0].rank, 2);
  EXPECT_EQ(got[0].pid, 77);
  EXPECT_FALSE(heartbeat_receiver::open("not-an-address"));
}

TEST(JobNodes, AnAgentRunsOnlyAWorkerWithHarmlessValues) {
  worker_start ok{"job-1a2b", 1, 4, "train:policy+critic", "10.0.0.1:4000", "/srv/jobs", 30000};
  EXPECT_TRUE(check_worker_start(ok));
  EXPECT_EQ(worker_argv("/bin/troupe", ok),
            (std::vector<std::string>{"/bin/troupe", "worker", "--driver", "10.0.0.1:4000", "--rank", "1", "--world",
                                      "4", "--role", "train:policy+critic", "--timeout-ms", "30000"}));
  auto refused = [&](worker_start s) {
    auto r = check_worker_start(s);
    EXPECT_FALSE(r);
    return r ? std::string{} : describe(r.error());
  };
  auto s = ok;
  s.job_id = "../../etc";
  EXPECT_NE(refused(s).find("StartWorker.job_id"), std::string::npos);
  s = ok, s.label = "x; rm -rf /";
  EXPECT_NE(refused(s).find("StartWorker.label"), std::string::npos);
  s = ok, s.label = "--driver";
  EXPECT_NE(refused(s).find("not starting with '-'"), std::string::npos) << "it would read as a flag";
  s = ok, s.rank = 4;
  EXPECT_NE(refused(s).find("StartWorker.rank: 4 outside 0..3"), std::string::npos);
  s = ok, s.world = 0;
  EXPECT_NE(refused(s).find("StartWorker.world"), std::string::npos);
  s = ok, s.driver = "10.0.0.1";
  EXPECT_NE(refused(s).find("StartWorker.driver: expected HOST:PORT"), std::string::npos);
  s = ok, s.driver = "$(reboot):1";
  EXPECT_NE(refused(s).find("StartWorker.driver"), std::string::npos);
  s = ok, s.cwd = "relative/dir";
  EXPECT_NE(refused(s).find("StartWorker.cwd: expected an absolute path"), std::string::npos);
  s = ok, s.timeout_ms = 0;
  EXPECT_NE(refused(s).find("StartWorker.timeout_ms"), std::string::npos);
}
