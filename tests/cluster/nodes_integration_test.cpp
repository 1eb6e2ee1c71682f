// Node agents as users run them: `troupe controller` and `troupe node`
// processes on loopback, `troupe nodes` listing them; an agent that stops
// leaves, one that goes silent or dies is lost within a bounded time, and
// a wrong secret, a shared name or a readable secret file is refused; and
// the same across hosts (network namespaces) over TLS.

#include "actors/job/events.hpp"
#include "cluster/job_store.hpp"
#include "cluster/node_agent.hpp"
#include "tests/cluster/control_harness.hpp"
#include "tests/support/netns.hpp"

#include <sys/stat.h>

#include <chrono>
#include <map>

using namespace troupe;
using namespace troupe::cluster;

namespace {

// A controller whose nodes heartbeat every 100 ms and are lost after 1 s.
void start_fast(test::controller_process& ctl, test::temp_dir& tmp) {
  auto cfg = tmp.write("controller.yaml", "nodes: {heartbeat_ms: 100, lost_after_ms: 1000}\n");
  ctl.start({"--config", cfg});
}

std::vector<audit_record> audit_of(const test::controller_process& ctl) {
  auto store = job_store::open(ctl.state_dir() + "/jobs.db");
  EXPECT_TRUE(store) << describe(store.error());
  if (!store)
    return {};
  auto a = (*store)->audit_log(1000);
  return a ? *a : std::vector<audit_record>{};
}

} // namespace

TEST(Nodes, AgentsJoinWithTheirResourcesAndLeaveWhenStopped) {
  test::temp_dir tmp;
  test::controller_process ctl{tmp.file("state")};
  start_fast(ctl, tmp);
  auto api = ctl.client();
  test::node_process a, b;
  a.start(ctl, "node-a", {"--cores", "3", "--memory-gb", "2", "--gpus", "0"});
  b.start(ctl, "node-b", {"--advertise", "10.9.8.7"});
  ASSERT_TRUE(test::node_reaches(api, "node-a", node_state::ready)) << a.log();
  ASSERT_TRUE(test::node_reaches(api, "node-b", node_state::ready)) << b.log();

  auto na = test::node_named(api, "node-a");
  EXPECT_EQ(na->resources.cores, 3);
  EXPECT_EQ(na->resources.memory_bytes, 2LL << 30);
  EXPECT_EQ(na->resources.gpus, 0);
  EXPECT_EQ(na->address, "127.0.0.1") << "the address the controller sees";
  EXPECT_EQ(na->agent_pid, a.pid());
  auto nb = test::node_named(api, "node-b");
  EXPECT_EQ(nb->address, "10.9.8.7") << "the advertised address";
  EXPECT_GT(nb->resources.cores, 0) << "detected";
  EXPECT_GT(nb->resources.memory_bytes, 64LL << 20) << "detected";

  // Heartbeats keep coming.
  auto first = na->last_heartbeat_us;
  EXPECT_TRUE(test::eventually([&] { return test::node_named(api, "node-a")->last_heartbeat_us > first; }, 5));

  // The CLI lists both, as a table and as JSON.
  auto table = ctl.cli({"nodes"});
  ASSERT_EQ(table.code, 0) << table.err;
  EXPECT_NE(table.out.find("node-a"), std::string::npos) << table.out;
  EXPECT_NE(table.out.find("10.9.8.7"), std::string::npos) << table.out;
  auto json = ctl.cli({"nodes", "--json"});
  ASSERT_EQ(json.code, 0) << json.err;
  auto j = nlohmann::json::parse(json.out);
  ASSERT_EQ(j.size(), 2u);
  EXPECT_EQ(j[0]["name"], "node-a");
  EXPECT_EQ(j[0]["state"], "ready");
  EXPECT_EQ(j[0]["cores"], 3);

  // SIGTERM: the agent leaves (exit 0) and the node says so.
  auto st = a.stop(SIGTERM);
  EXPECT_TRUE(st.ok()) << st.describe() << a.log();
  ASSERT_TRUE(test::node_reaches(api, "node-a", node_state::left, 10));
  EXPECT_NE(test::node_named(api, "node-a")->reason.find("stopped"), std::string::npos);
  EXPECT_EQ(test::node_named(api, "node-b")->state, node_state::ready);

  // A left node may join again under its name.
  test::node_process again;
  again.start(ctl, "node-a");
  EXPECT_TRUE(test::node_reaches(api, "node-a", node_state::ready)) << again.log();
  EXPECT_EQ(test::node_named(api, "node-a")->agent_pid, again.pid());

  bool joined = false, left = false;
  for (const auto& r : audit_of(ctl)) {
    joined = joined || (r.what == "NodeJoin" && r.target == "node-b" && r.result == "ok");
    left = left || (r.what == "NodeLeave" && r.target == "node-a");
  }
  EXPECT_TRUE(joined);
  EXPECT_TRUE(left);
  again.stop();
  b.stop();
  ctl.stop();
}

TEST(Nodes, ASilentNodeIsLostWithinItsBoundAndAKilledOneAtOnce) {
  test::temp_dir tmp;
  test::controller_process ctl{tmp.file("state")};
  start_fast(ctl, tmp);
  auto api = ctl.client();
  test::node_process quiet, killed;
  quiet.start(ctl, "quiet");
  killed.start(ctl, "killed");
  ASSERT_TRUE(test::node_reaches(api, "quiet", node_state::ready)) << quiet.log();
  ASSERT_TRUE(test::node_reaches(api, "killed", node_state::ready)) << killed.log();

  // Stopped (SIGSTOP): its connection stays open but it says nothing.
  auto stop_us = actors::job::now_us();
  quiet.signal(SIGSTOP);
  ASSERT_TRUE(test::node_reaches(api, "quiet", node_state::lost, 10));
  auto took_ms = (test::node_named(api, "quiet")->state_time_us - stop_us) / 1000;
  EXPECT_GE(took_ms, 900) << "not before lost_after_ms";
  EXPECT_LT(took_ms, 2500) << "lost_after_ms and a sweep";
  EXPECT_NE(test::node_named(api, "quiet")->reason.find("no heartbeat"), std::string::npos);
  // Woken up, it finds its stream ended and joins again.
  quiet.signal(SIGCONT);
  EXPECT_TRUE(test::node_reaches(api, "quiet", node_state::ready, 10)) << quiet.log();

  // Killed: its connection breaks, and the node is lost at once.
  auto kill_us = actors::job::now_us();
  killed.signal(SIGKILL);
  ASSERT_TRUE(test::node_reaches(api, "killed", node_state::lost, 10));
  EXPECT_LT(test::node_named(api, "killed")->state_time_us - kill_us, 900'000)
      << "before the heartbeat bound: the broken connection tells";
  EXPECT_NE(test::node_named(api, "killed")->reason.find("connection closed"), std::string::npos)
      << test::node_named(api, "killed")->reason;

  bool audited = false;
  for (const auto& r : audit_of(ctl))
    audited = audited || (r.what == "NodeLost" && r.target == "quiet");
  EXPECT_TRUE(audited);
  quiet.stop();
  ctl.stop();
}

TEST(Nodes, WrongSecretsSharedNamesAndReadableSecretFilesAreRefused) {
  test::temp_dir tmp;
  test::controller_process ctl{tmp.file("state")};
  start_fast(ctl, tmp);
  auto api = ctl.client();

  auto wrong = tmp.write("wrong_secret", "0123456789abcdef0123456789abcdef\n");
  ::chmod(wrong.c_str(), 0600);
  test::node_process intruder;
  intruder.start(ctl, "intruder", {}, wrong);
  auto st = intruder.wait();
  EXPECT_EQ(st.code, agent_exit_refused) << intruder.log();
  EXPECT_NE(intruder.log().find("wrong cluster secret"), std::string::npos) << intruder.log();
  EXPECT_FALSE(test::node_named(api, "intruder")) << "never listed";

  // The API token is not the cluster secret.
  auto token_file = ctl.state_dir() + "/token";
  test::node_process with_token;
  with_token.start(ctl, "with-token", {}, token_file);
  EXPECT_EQ(with_token.wait().code, agent_exit_refused) << with_token.log();

  auto readable = tmp.write("readable_secret", test::text_of(ctl.state_dir() + "/cluster_secret"));
  ::chmod(readable.c_str(), 0644);
  test::node_process careless;
  careless.start(ctl, "careless", {}, readable);
  EXPECT_EQ(careless.wait().code, agent_exit_refused);
  EXPECT_NE(careless.log().find("readable by others"), std::string::npos) << careless.log();

  test::node_process first, twin;
  first.start(ctl, "twin");
  ASSERT_TRUE(test::node_reaches(api, "twin", node_state::ready)) << first.log();
  twin.start(ctl, "twin");
  EXPECT_EQ(twin.wait().code, agent_exit_refused) << twin.log();
  EXPECT_NE(twin.log().find("already joined"), std::string::npos) << twin.log();
  EXPECT_EQ(test::node_named(api, "twin")->agent_pid, first.pid()) << "the first keeps its name";

  auto bad_name = ctl.cli({"node", "--controller", ctl.address(), "--name", "no/slashes", "--secret",
                           ctl.state_dir() + "/cluster_secret"},
                          30);
  EXPECT_EQ(bad_name.code, agent_exit_refused);
  EXPECT_NE(bad_name.err.find("not a node name"), std::string::npos) << bad_name.err;

  // Refusals are in the audit log, with who and why.
  int refused = 0;
  for (const auto& r : audit_of(ctl))
    if (r.what == "NodeJoin" && r.result.find("UNAUTHENTICATED: wrong cluster secret") == 0) {
      ++refused;
      EXPECT_NE(r.who.find("127.0.0.1"), std::string::npos) << r.who;
    }
  EXPECT_EQ(refused, 2);
  first.stop();
  ctl.stop();
}

TEST(Nodes, AnAgentGivesUpOnAControllerThatIsGone) {
  test::temp_dir tmp;
  test::controller_process ctl{tmp.file("state")};
  start_fast(ctl, tmp);
  auto api = ctl.client();
  test::node_process a;
  a.start(ctl, "orphan", {"--reconnect-s", "2"});
  ASSERT_TRUE(test::node_reaches(api, "orphan", node_state::ready)) << a.log();
  ctl.stop(SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  auto st = a.wait(20);
  EXPECT_EQ(st.code, agent_exit_unreachable) << a.log();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_NE(a.log().find("joining again"), std::string::npos) << a.log();
}

// Three hosts (network namespaces): the controller on one, listening on its
// network address with TLS, an agent on each of the others. The nodes are
// known by the addresses the controller sees; a host cut off the network
// (no reset reaches anyone) is lost within the heartbeat bound.
TEST(Nodes, AcrossHostsOverTlsAndAHostCutOffIsLost) {
  std::string why;
  auto lab = test::netns_lab::create(3, why);
  if (!lab)
    GTEST_SKIP() << why;
  test::temp_dir tmp;
  ASSERT_TRUE(test::make_test_certificate(tmp.path().string(), lab->address(0), why)) << why;
  auto cert = tmp.file("cert.pem"), key = tmp.file("key.pem");
  test::controller_process ctl{tmp.file("state")};
  ctl.place(lab->on(0, {}), lab->address(0) + ":0");
  auto cfg = tmp.write("controller.yaml", "nodes: {heartbeat_ms: 100, lost_after_ms: 1000}\n");
  ctl.start({"--config", cfg, "--tls-cert", cert, "--tls-key", key});
  EXPECT_EQ(ctl.address().rfind(lab->address(0) + ":", 0), 0u) << ctl.address();

  // `troupe nodes` as a client on the controller's host, over TLS.
  auto nodes = [&] {
    auto r = test::run_process(lab->on(0, {TROUPE_BINARY_PATH, "nodes", "--json", "--address", ctl.address(),
                                           "--tls-ca", cert, "--state-dir", ctl.state_dir()}),
                               60);
    EXPECT_EQ(r.code, 0) << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    std::map<std::string, nlohmann::json> out;
    if (j.is_array())
      for (const auto& n : j)
        out[n["name"].get<std::string>()] = n;
    return out;
  };
  auto state_of = [&](const std::string& name) {
    auto n = nodes();
    return n.count(name) ? n[name]["state"].get<std::string>() : std::string{"absent"};
  };

  test::node_process one, two;
  one.start(ctl, "host-1", {"--tls-ca", cert}, {}, lab->on(1, {}));
  two.start(ctl, "host-2", {"--tls-ca", cert}, {}, lab->on(2, {}));
  ASSERT_TRUE(test::eventually([&] { return state_of("host-1") == "ready" && state_of("host-2") == "ready"; }, 30))
      << one.log() << two.log() << ctl.log();
  auto listed = nodes();
  EXPECT_EQ(listed["host-1"]["address"], lab->address(1)) << "seen from the controller's host";
  EXPECT_EQ(listed["host-2"]["address"], lab->address(2));

  // Without the CA the agent will not send the secret in clear text.
  auto plain = test::run_process(lab->on(1, {TROUPE_BINARY_PATH, "node", "--controller", ctl.address(), "--secret",
                                             ctl.state_dir() + "/cluster_secret", "--name", "plain"}),
                                 30);
  EXPECT_EQ(plain.code, agent_exit_refused);
  EXPECT_NE(plain.err.find("not loopback"), std::string::npos) << plain.err;

  // Host 2 loses its network: nothing resets the connection; silence tells.
  // (Timed by the controller's record: each `troupe nodes` here is a process
  // start, slow on a loaded machine.)
  auto cut_us = std::chrono::duration_cast<std::chrono::microseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  ASSERT_TRUE(lab->cut(2));
  ASSERT_TRUE(test::eventually([&] { return state_of("host-2") == "lost"; }, 20));
  auto lost_us = nodes()["host-2"]["state_time_us"].get<int64_t>();
  EXPECT_GT(lost_us, cut_us);
  EXPECT_LT(lost_us - cut_us, 5'000'000) << "lost within 5 s of the cut";
  EXPECT_NE(nodes()["host-2"]["reason"].get<std::string>().find("no heartbeat"), std::string::npos);
  EXPECT_EQ(state_of("host-1"), "ready");
  two.stop(SIGKILL);
  EXPECT_TRUE(one.stop(SIGTERM).ok()) << one.log();
  ctl.stop();
}
