// Jobs across machines as users run them: a controller and node agents as
// real processes, on loopback or on hosts made of network namespaces (TLS
// between them). The disaggregated job runs its trainers on one host and
// its rollout on another and learns as in one process, weights going by
// broadcast; a host whose agent and workers are killed, or that is cut off
// the network, fails the job within 5 s naming the node, its ranks and the
// phase when its roles may not be restarted, and when they may, its
// workers move to a node that joins and the job finishes; a job that
// needs more nodes
// than are ready waits queued with the reason and starts nothing; and no
// worker is left anywhere afterwards.

#include "actors/rl/job.hpp"
#include "cluster/role_host.hpp"
#include "tests/actors/job_yaml.hpp"
#include "tests/cluster/control_harness.hpp"
#include "tests/cluster/networked_system.hpp"
#include "tests/cluster/same_learning.hpp"
#include "tests/support/netns.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

using namespace troupe;
using troupe::actors::rl::testing::events_of;
using troupe::actors::rl::testing::parse_job;
using troupe::actors::rl::testing::tiny_job;

namespace {

const std::string disaggregated_on_two_nodes =
    std::string{troupe::actors::rl::testing::disaggregated_placement} + "resources: {nodes: 2, launcher: nodes}\n";

int64_t now_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Command lines of the processes running now (pid → argv joined by spaces).
std::map<int, std::string> processes() {
  std::map<int, std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc")) {
    auto name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos)
      continue;
    std::ifstream in(e.path() / "cmdline", std::ios::binary);
    std::string text{std::istreambuf_iterator<char>(in), {}};
    for (auto& c : text)
      c = c == '\0' ? ' ' : c;
    if (!text.empty())
      out[std::stoi(name)] = text;
  }
  return out;
}

// Workers of a driver whose registrar is at `host` (any port).
std::vector<int> workers_of_driver_at(const std::string& host) {
  std::vector<int> out;
  for (const auto& [pid, cmd] : processes())
    if (cmd.find(" worker --driver " + host + ":") != std::string::npos)
      out.push_back(pid);
  return out;
}

int parent_of(int pid);

// The processes `pid` started (an agent's workers).
std::vector<int> children_of(int pid) {
  std::vector<int> out;
  for (const auto& [p, cmd] : processes())
    if (parent_of(p) == pid)
      out.push_back(p);
  return out;
}

int parent_of(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text{std::istreambuf_iterator<char>(in), {}};
  auto close = text.rfind(')');
  if (close == std::string::npos)
    return -1;
  std::istringstream rest{text.substr(close + 2)};
  char state = 0;
  int ppid = -1;
  rest >> state >> ppid;
  return ppid;
}

// A controller on host 0 of `lab` (TLS: it listens on a routable address)
// with fast heartbeats, and agents host-1 .. host-N on the others.
struct cluster_on_hosts {
  test::netns_lab& lab;
  test::temp_dir tmp;
  std::string cert, key;
  test::controller_process ctl{tmp.file("state")};
  std::vector<std::unique_ptr<test::node_process>> agents;

  explicit cluster_on_hosts(test::netns_lab& l) : lab(l) {
    std::string why;
    EXPECT_TRUE(test::make_test_certificate(tmp.path().string(), lab.address(0), why)) << why;
    cert = tmp.file("cert.pem"), key = tmp.file("key.pem");
    ctl.place(lab.on(0, {}), lab.address(0) + ":0");
    auto cfg = tmp.write("controller.yaml", "nodes: {heartbeat_ms: 200, lost_after_ms: 2000}\n");
    ctl.start({"--config", cfg, "--tls-cert", cert, "--tls-key", key});
    for (int h = 1; h < lab.hosts(); ++h) {
      agents.push_back(std::make_unique<test::node_process>());
      agents.back()->start(ctl, "host-" + std::to_string(h), {"--tls-ca", cert, "--cores", "2"}, {}, lab.on(h, {}));
    }
  }

  ~cluster_on_hosts() {
    for (auto& a : agents)
      a->stop(SIGTERM);
    ctl.stop();
  }

  // `troupe ARGS` as a client on the controller's host.
  test::cli_result cli(std::vector<std::string> args, int timeout_s = 300) {
    std::vector<std::string> argv{TROUPE_BINARY_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    for (const auto& a : {std::string{"--address"}, ctl.address(), std::string{"--tls-ca"}, cert,
                          std::string{"--state-dir"}, ctl.state_dir()})
      argv.push_back(a);
    return test::run_process(lab.on(0, argv), timeout_s);
  }

  nlohmann::json status(const std::string& id) {
    auto r = cli({"status", id, "--json"}, 60);
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    return j.is_object() ? j : nlohmann::json::object();
  }

  // Submits the disaggregated job with endless RL on both nodes, no role
  // restartable (a lost node ends it), and waits for its first RL step;
  // its id ("" and a failure when it did not get there).
  std::string submit_endless() {
    return submit_stepping(
        {"rl.iterations=" + std::to_string(test::endless), "supervision.budget=0"});
  }

  // Submits the disaggregated job on both nodes with `sets` and waits for
  // its first RL step; its id ("" and a failure when it did not get there).
  std::string submit_stepping(const std::vector<std::string>& sets) {
    auto spec = tmp.write("job.yaml", tiny_job("run") + disaggregated_on_two_nodes);
    std::vector<std::string> args{"submit", spec};
    for (const auto& x : sets)
      args.insert(args.end(), {"--set", x});
    auto r = cli(args, 60);
    EXPECT_EQ(r.code, 0) << r.err;
    auto id = r.out.substr(0, r.out.find('\n'));
    bool stepped = r.code == 0 && test::eventually(
                                      [&] {
                                        auto s = status(id);
                                        return s.value("stage", "") == "rl" && s.value("iteration", 0) >= 1;
                                      },
                                      300);
    EXPECT_TRUE(stepped) << logs();
    return stepped ? id : std::string{};
  }

  // Host `agent + 1` goes down hard: its agent and every process it started
  // (false when it ran none).
  bool kill_host(size_t agent) {
    auto children = children_of(agents[agent]->pid());
    agents[agent]->signal(SIGKILL);
    for (int pid : children)
      ::kill(pid, SIGKILL);
    return !children.empty();
  }

  // Whether job `id` comes to wait for a node (NOTE [replacing a worker])
  // within 60 s; `s` its last status.
  bool waits_for_a_node(const std::string& id, nlohmann::json& s) {
    return test::eventually(
        [&] {
          s = status(id);
          return s.value("wait_reason", "").find("waits for a node") != std::string::npos;
        },
        60);
  }

  bool all_ready() {
    auto r = cli({"nodes", "--json"}, 60);
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    int ready = 0;
    if (j.is_array())
      for (const auto& n : j)
        ready += n.value("state", "") == "ready" ? 1 : 0;
    return ready == static_cast<int>(agents.size());
  }

  std::string logs() {
    std::string out = "controller: " + ctl.log();
    for (auto& a : agents)
      out += "\nagent: " + a->log();
    // The jobs' drivers, whose side a failure is often on.
    std::error_code ec;
    for (const auto& d : std::filesystem::directory_iterator{ctl.state_dir() + "/jobs", ec})
      for (const auto* name : {"driver.log", "run/troupe.log"}) {
        auto log = runtime::read_file((d.path() / name).string());
        if (log && !log->empty())
          out += "\n" + d.path().filename().string() + "/" + name + ": " +
                 (log->size() > 6000 ? "..." + log->substr(log->size() - 6000) : *log);
      }
    return out;
  }
};

// Three hosts: the controller's and two nodes, ready (skips where hosts
// cannot be made).
class MultiHost : public ::testing::Test {
protected:
  void SetUp() override {
    std::string why;
    lab = test::netns_lab::create(3, why);
    if (!lab)
      GTEST_SKIP() << why;
    cluster = std::make_unique<cluster_on_hosts>(*lab);
    ASSERT_TRUE(test::eventually([&] { return cluster->all_ready(); }, 60)) << cluster->logs();
  }

  std::unique_ptr<test::netns_lab> lab;
  std::unique_ptr<cluster_on_hosts> cluster;
};

} // namespace

TEST_F(MultiHost, TheDisaggregatedJobLearnsAcrossHostsAsInOneProcess) {
  auto& c = *cluster;

  // The same job in one process, for the numbers.
  auto local = parse_job(tiny_job(c.tmp.file("local")));
  ASSERT_TRUE(local) << describe(local.error());
  {
    test::networked_system ns;
    auto ran = cluster::run_placed_job(*ns.sys, *local, {}, {});
    ASSERT_TRUE(ran) << describe(ran.error());
  }

  auto spec = c.tmp.write("job.yaml", tiny_job("run") + disaggregated_on_two_nodes);
  auto r = c.cli({"submit", spec, "--wait"}, 600);
  ASSERT_EQ(r.code, 0) << r.out << r.err << c.logs();
  auto id = r.out.substr(0, r.out.find('\n'));
  auto s = c.status(id);
  ASSERT_EQ(s.value("state", ""), "succeeded") << s.dump(2);
  EXPECT_EQ(s["nodes"], nlohmann::json::array({"host-1", "host-2"})) << "node 0 (trainers) picked first by name";
  auto run_dir = s.value("run_dir", "");
  test::expect_same_learning(test::metrics_of(local->run.dir), test::metrics_of(run_dir));

  // Weights crossed hosts by broadcast; each role ran on its node.
  auto syncs = events_of(run_dir, "weight_sync");
  ASSERT_FALSE(syncs.empty());
  for (const auto& e : syncs)
    EXPECT_EQ(e.value("transport", ""), "broadcast") << e.dump();
  std::map<std::string, std::string> node_of;
  for (const auto& e : events_of(run_dir, "role"))
    if (e.value("stage", "") == "rl")
      node_of[e.value("role", "")] = e.value("node", "");
  EXPECT_EQ(node_of["policy"], "host-1");
  EXPECT_EQ(node_of["critic"], "host-1");
  EXPECT_EQ(node_of["rollout"], "host-2");
  EXPECT_EQ(node_of["reward"], "host-2");

  // Every worker ended with the job, on every host.
  EXPECT_TRUE(test::eventually([&] { return workers_of_driver_at(lab->address(0)).empty(); }, 10));
  EXPECT_NE(c.agents[0]->log().find("started worker 0 of job " + id), std::string::npos) << c.logs();
  EXPECT_NE(c.agents[1]->log().find("started worker 2 of job " + id), std::string::npos) << c.logs();
}

TEST_F(MultiHost, AHostKilledMidRunFailsTheJobWithin5sNamingItAndLeavesNothing) {
  auto& c = *cluster;
  auto id = c.submit_endless();
  ASSERT_FALSE(id.empty());

  // Host 2 goes down hard: its agent and every process it started.
  auto agent = c.agents[1]->pid();
  auto children = children_of(agent);
  ASSERT_FALSE(children.empty()) << "host-2 runs the rollout and the judges";
  auto killed_us = now_us();
  c.agents[1]->signal(SIGKILL);
  for (int pid : children)
    ::kill(pid, SIGKILL);

  nlohmann::json s;
  ASSERT_TRUE(test::eventually(
      [&] {
        s = c.status(id);
        return s.value("state", "") == "failed";
      },
      30))
      << s.dump(2) << c.logs();
  auto took_us = s.value("end_time_us", int64_t{0}) - killed_us;
  EXPECT_LT(took_us, 5'000'000) << "failed " << took_us / 1000 << " ms after the kill";
  auto error = s.value("error", "");
  EXPECT_NE(error.find("host-2"), std::string::npos) << error;
  // The role named is the one whose request noticed first: any of host-2's
  // (the kill lands in whichever phase the endless job is in).
  EXPECT_TRUE(error.find("rollout") != std::string::npos ||
              error.find("reference") != std::string::npos ||
              error.find("reward") != std::string::npos)
      << error;
  EXPECT_NE(error.find("phase"), std::string::npos) << error;
  // Host 1's workers are ended too (StopJob), and no driver is left.
  EXPECT_TRUE(test::eventually([&] { return workers_of_driver_at(lab->address(0)).empty(); }, 10))
      << c.agents[0]->log();
  // The agent logs the exit once it has reaped the worker.
  std::string host1;
  EXPECT_TRUE(test::eventually(
      [&] {
        host1 = c.agents[0]->log();
        return host1.find("worker 0 of job " + id + " exited") != std::string::npos ||
               host1.find("worker 0 of job " + id + " killed") != std::string::npos;
      },
      10))
      << host1;
}

TEST_F(MultiHost, AHostCutOffTheNetworkMidRunFailsTheJobWithin5sNamingIt) {
  // Nothing resets a connection: the controller finds the node silent
  // (lost_after_ms 2000 here) and fails the job.
  auto& c = *cluster;
  auto id = c.submit_endless();
  ASSERT_FALSE(id.empty());
  auto cut_us = now_us();
  ASSERT_TRUE(lab->cut(2));
  nlohmann::json s;
  ASSERT_TRUE(test::eventually(
      [&] {
        s = c.status(id);
        return s.value("state", "") == "failed";
      },
      30))
      << s.dump(2) << c.logs();
  auto took_us = s.value("end_time_us", int64_t{0}) - cut_us;
  EXPECT_LT(took_us, 5'000'000) << "failed " << took_us / 1000 << " ms after the cut";
  auto error = s.value("error", "");
  EXPECT_NE(error.find("node host-2"), std::string::npos) << error;
  EXPECT_NE(error.find("rollout"), std::string::npos) << error;
  // Host 1's workers are ended; host 2's agent, cut off, still runs its own
  // (it is stopped with the cluster, and they die with it).
  auto host1 = c.agents[0]->pid();
  EXPECT_TRUE(test::eventually([&] { return children_of(host1).empty(); }, 10)) << c.agents[0]->log();
}

// NOTE [replacing a worker]: host-2's roles (the rollout, the reference
// and the reward) may be restarted (their default), so losing host-2 is
// for the driver to recover from: it asks the controller for those
// workers again. No other node is ready (host-1 plays the job's other
// node), so the job waits, saying why, until a node joins; that node
// takes host-2's place and the job ends as it would have.
TEST_F(MultiHost, AKilledHostsWorkersMoveToANodeThatJoinsAndTheJobFinishes) {
  auto& c = *cluster;
  const std::vector<std::string> sets = {"rl.iterations=12"};
  auto local = parse_job(tiny_job(c.tmp.file("local")), sets);
  ASSERT_TRUE(local) << describe(local.error());
  {
    test::networked_system ns;
    auto ran = cluster::run_placed_job(*ns.sys, *local, {}, {});
    ASSERT_TRUE(ran) << describe(ran.error());
  }
  auto id = c.submit_stepping(sets);
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(c.kill_host(1)) << "host-2 runs the rollout and the judges";
  nlohmann::json s;
  ASSERT_TRUE(c.waits_for_a_node(id, s)) << s.dump(2) << c.logs();
  EXPECT_EQ(s.value("state", ""), "running") << s.dump(2);
  EXPECT_NE(s.value("wait_reason", "").find("host-2 is not ready"), std::string::npos) << s.dump(2);

  // A node joins where host-2 was.
  c.agents.push_back(std::make_unique<test::node_process>());
  c.agents.back()->start(c.ctl, "host-3", {"--tls-ca", c.cert, "--cores", "2"}, {}, lab->on(2, {}));
  ASSERT_TRUE(test::eventually(
      [&] {
        s = c.status(id);
        auto state = s.value("state", "");
        return state == "succeeded" || state == "failed";
      },
      300))
      << s.dump(2) << c.logs();
  ASSERT_EQ(s.value("state", ""), "succeeded") << s.dump(2) << c.logs();
  EXPECT_EQ(s["nodes"], nlohmann::json::array({"host-1", "host-3"}));
  EXPECT_EQ(s.value("wait_reason", ""), "");
  auto run_dir = s.value("run_dir", "");
  test::expect_same_learning(test::metrics_of(local->run.dir), test::metrics_of(run_dir));

  // Each of host-2's roles was restarted, on host-3.
  std::set<std::string> moved;
  for (const auto& e : events_of(run_dir, "role"))
    if (e.value("status", "") == "restarted") {
      EXPECT_EQ(e.value("node", ""), "host-3") << e.dump();
      moved.insert(e.value("role", ""));
    }
  EXPECT_EQ(moved, (std::set<std::string>{"rollout", "reference", "reward"}));
  EXPECT_NE(c.agents[2]->log().find("started worker 2 of job " + id), std::string::npos)
      << c.logs();
  EXPECT_NE(c.agents[2]->log().find("started worker 3 of job " + id), std::string::npos)
      << c.logs();
  EXPECT_NE(c.ctl.log().find("host-3 takes the place of lost node host-2"), std::string::npos)
      << c.ctl.log();
  EXPECT_TRUE(test::eventually([&] { return workers_of_driver_at(lab->address(0)).empty(); }, 10));
}

// NOTE [deadlocked collectives] on nodes: a policy rank on host-1 blocks
// for good inside a collective of its update; its process and its DP
// peer's run on and answer everything but that collective. The driver
// finds the deadlock in their heartbeats and tells both workers to end
// (a worker on a node is not the driver's to SIGKILL); their node's agent
// starts them again when the driver asks, and the rl stage rolls back.
TEST_F(MultiHost, TrainerRanksDeadlockedOnANodeAreEndedRestartedAndTheJobFinishes) {
  auto& c = *cluster;
  const std::vector<std::string> sets = {
      "rl.iterations=3", "supervision.heartbeat_s=1",
      "supervision.roles=[{role: policy, max_restarts: 3, backoff_ms: 0}, "
      "{role: critic, max_restarts: 3, backoff_ms: 0}]"};
  auto local = parse_job(tiny_job(c.tmp.file("local")), sets);
  ASSERT_TRUE(local) << describe(local.error());
  {
    test::networked_system ns;
    auto ran = cluster::run_placed_job(*ns.sys, *local, {}, {});
    ASSERT_TRUE(ran) << describe(ran.error());
  }
  auto spec = c.tmp.write("job.yaml", tiny_job("run") + disaggregated_on_two_nodes);
  std::vector<std::string> args{"submit", spec, "--wait"};
  for (const auto& x : sets)
    args.insert(args.end(), {"--set", x});
  args.insert(args.end(),
              {"--set", "debug.kills=[{role: policy, phase: update_actor, iteration: 2, "
                        "rank: 1, collective: 2, how: hang}]"});
  auto r = c.cli(args, 600);
  ASSERT_EQ(r.code, 0) << r.out << r.err << c.logs();
  auto id = r.out.substr(0, r.out.find('\n'));
  auto s = c.status(id);
  ASSERT_EQ(s.value("state", ""), "succeeded") << s.dump(2) << c.logs();
  auto run_dir = s.value("run_dir", "");
  test::expect_same_learning(test::metrics_of(local->run.dir), test::metrics_of(run_dir));
  std::string why;
  for (const auto& e : events_of(run_dir, "role"))
    if (e.value("status", "") == "restarting" && e.value("role", "") == "policy")
      why = e.value("reason", "");
  EXPECT_NE(why.find("is deadlocked: every rank of collective group"), std::string::npos)
      << why << c.logs();
  // Both trainer workers were started twice on host-1.
  const auto agent_log = c.agents[0]->log();
  for (const auto* worker : {"started worker 0 of job ", "started worker 1 of job "}) {
    size_t starts = 0;
    for (auto at = agent_log.find(worker + id); at != std::string::npos;
         at = agent_log.find(worker + id, at + 1))
      ++starts;
    EXPECT_EQ(starts, 2u) << worker << c.logs();
  }
  EXPECT_TRUE(test::eventually([&] { return workers_of_driver_at(lab->address(0)).empty(); }, 10));
}

// A job waiting for a node (NOTE [replacing a worker]) is blocked in a
// restart; a cancel ends the wait and the job, cancelled.
TEST_F(MultiHost, AJobWaitingForANodeIsCancelled) {
  auto& c = *cluster;
  auto id = c.submit_stepping({"rl.iterations=" + std::to_string(test::endless)});
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(c.kill_host(1)) << "host-2 runs the rollout and the judges";
  nlohmann::json s;
  ASSERT_TRUE(c.waits_for_a_node(id, s)) << s.dump(2) << c.logs();
  auto cancelled = c.cli({"cancel", id}, 60);
  EXPECT_EQ(cancelled.code, 0) << cancelled.out << cancelled.err;
  ASSERT_TRUE(test::eventually(
      [&] {
        s = c.status(id);
        return s.value("state", "") == "cancelled" || s.value("state", "") == "failed";
      },
      30))
      << s.dump(2) << c.logs();
  EXPECT_EQ(s.value("state", ""), "cancelled") << s.dump(2);
  EXPECT_EQ(s.value("wait_reason", ""), "");
  EXPECT_TRUE(test::eventually([&] { return workers_of_driver_at(lab->address(0)).empty(); }, 10));
}

TEST(NodeQueue, AJobNeedingMoreNodesThanAreReadyWaitsQueuedAndStartsNothing) {
  // On loopback: the agents are "nodes" of this machine.
  test::temp_dir tmp;
  test::controller_process ctl{tmp.file("state")};
  ctl.start();
  test::node_process one, two;
  one.start(ctl, "one", {"--advertise", "127.0.0.1", "--cores", "2"});
  auto api = ctl.client();
  ASSERT_TRUE(test::node_reaches(api, "one", cluster::node_state::ready)) << one.log();

  auto spec = tmp.write("job.yaml", tiny_job("run") + disaggregated_on_two_nodes);
  auto id = test::submit(ctl, spec);
  ASSERT_FALSE(id.empty());
  std::optional<cluster::job_view> v;
  ASSERT_TRUE(test::eventually(
      [&] {
        auto g = api.get(id);
        if (g)
          v = *g;
        return v && !v->wait_reason.empty();
      },
      30));
  EXPECT_EQ(v->state, cluster::ctl_state::queued);
  EXPECT_NE(v->wait_reason.find("waiting for nodes: the plan needs 2 nodes with 2, 2 free devices"),
            std::string::npos)
      << v->wait_reason;
  EXPECT_NE(v->wait_reason.find("one (2 of 2 free)"), std::string::npos) << v->wait_reason;
  EXPECT_EQ(v->driver_pid, 0) << "never half-started";
  EXPECT_TRUE(children_of(one.pid()).empty()) << "no worker on the ready node";
  auto shown = ctl.cli({"status", id});
  EXPECT_NE(shown.out.find("waiting:   waiting for nodes"), std::string::npos) << shown.out;

  // A second node joins: the job starts on both and finishes.
  two.start(ctl, "two", {"--advertise", "127.0.0.1", "--cores", "2"});
  ASSERT_TRUE(test::eventually(
      [&] {
        auto g = api.get(id);
        return g && cluster::is_final(g->state);
      },
      300))
      << ctl.log() << one.log() << two.log();
  auto done = api.get(id);
  ASSERT_TRUE(done);
  EXPECT_EQ(done->state, cluster::ctl_state::succeeded) << done->status.error;
  EXPECT_EQ(done->nodes, (std::vector<std::string>{"one", "two"}));
  EXPECT_TRUE(done->wait_reason.empty());
  EXPECT_TRUE(test::eventually([&] { return children_of(one.pid()).empty() && children_of(two.pid()).empty(); }, 10));
  EXPECT_TRUE(one.stop(SIGTERM).ok()) << one.log();
  EXPECT_TRUE(two.stop(SIGTERM).ok()) << two.log();
  ctl.stop();
}
