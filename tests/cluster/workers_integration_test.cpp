// Worker processes joined through CAF's middleman: start, answer, shut
// down; a killed worker fails the job naming it; a worker whose driver goes
// away exits. Real `troupe worker` processes (the binary built with the
// tests).
#include "actors/actor_system.hpp"
#include "cluster/local_launcher.hpp"
#include "cluster/workers.hpp"
#include "tests/cluster/networked_system.hpp"
#include "tests/support/temp_dir.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <future>

#include <sys/types.h>
#include <unistd.h>

using namespace troupe;
using namespace troupe::cluster;

namespace {

launch_options two_workers(const test::temp_dir& tmp) {
  launch_options o;
  o.executable = TROUPE_BINARY_PATH;
  o.roles = {"policy", "rollout"};
  o.log_dir = tmp.file("logs");
  o.timeout_ms = 20000;
  return o;
}

bool process_gone(int64_t pid) {
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

} // namespace

TEST(Workers, StartAnswerAndShutDown) {
  test::temp_dir tmp;
  test::networked_system net;
  auto w = worker_set::launch(*net.sys, two_workers(tmp));
  ASSERT_TRUE(w) << describe(w.error());
  ASSERT_EQ(w->workers().size(), 2u);
  caf::scoped_actor self{*net.sys};
  for (const auto& info : w->workers()) {
    EXPECT_NE(info.pid, ::getpid());
    int32_t answered_rank = -1;
    int64_t echoed = 0;
    self->request(info.handle, std::chrono::seconds(10), worker_ping_atom::value, int64_t{41})
        .receive(
            [&](int64_t x, int32_t rank) {
              echoed = x;
              answered_rank = rank;
            },
            [&](caf::error& e) { ADD_FAILURE() << net.sys->render(e); });
    EXPECT_EQ(echoed, 41);
    EXPECT_EQ(answered_rank, info.rank);
  }
  EXPECT_FALSE(w->check());
  auto pids = std::vector<int64_t>{w->workers()[0].pid, w->workers()[1].pid};
  auto down = w->shutdown(10000);
  EXPECT_TRUE(down) << describe(down.error());
  for (auto pid : pids)
    EXPECT_TRUE(process_gone(pid)) << "pid " << pid;
}

TEST(Workers, AKilledWorkerFailsTheJobNamingItWithinTenSeconds) {
  test::temp_dir tmp;
  test::networked_system net;
  int64_t survivor = 0;
  {
    auto w = worker_set::launch(*net.sys, two_workers(tmp));
    ASSERT_TRUE(w) << describe(w.error());
    auto victim = w->workers()[1].pid;
    survivor = w->workers()[0].pid;
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(::kill(static_cast<pid_t>(victim), SIGKILL), 0);
    auto err = w->wait_for_failure(10000);
    auto waited = std::chrono::steady_clock::now() - t0;
    ASSERT_TRUE(err) << "no failure reported";
    auto msg = describe(err);
    EXPECT_NE(msg.find("worker 1 (role rollout, pid " + std::to_string(victim) + ")"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("killed by signal 9"), std::string::npos) << msg;
    EXPECT_LT(waited, std::chrono::seconds(10));
  }
  // Destroying the launcher leaves no process behind.
  EXPECT_TRUE(process_gone(survivor));
}

TEST(Workers, AWorkerExitsWhenItsDriverGoesAway) {
  test::temp_dir tmp;
  test::networked_system net;
  std::promise<void> registered;
  auto fake_driver = net.sys->spawn([&](caf::event_based_actor*) -> caf::behavior {
    return {[&](register_atom, int32_t, int64_t, const caf::actor&) {
      registered.set_value();
      return std::make_tuple(uint16_t{0}, int64_t{0}); // no heartbeats
    }};
  });
  auto port = net.sys->middleman().publish(fake_driver, 0, "127.0.0.1");
  ASSERT_TRUE(port);
  process_spec spec;
  spec.name = "worker 0";
  spec.argv = {TROUPE_BINARY_PATH, "worker", "--driver", "127.0.0.1:" + std::to_string(*port),
               "--rank", "0", "--world", "1", "--role", "policy"};
  spec.output_path = tmp.file("worker.log");
  auto proc = local_process::spawn(spec);
  ASSERT_TRUE(proc) << describe(proc.error());
  ASSERT_EQ(registered.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  caf::anon_send_exit(fake_driver, caf::exit_reason::user_shutdown);
  auto st = proc->wait_for(15000);
  ASSERT_TRUE(st) << describe(st.error());
  EXPECT_EQ(st->code, worker_exit_driver_lost) << st->describe();
}

TEST(Workers, ABadDriverAddressIsRefused) {
  test::temp_dir tmp;
  process_spec spec;
  spec.name = "worker";
  spec.argv = {TROUPE_BINARY_PATH, "worker", "--driver", "nowhere", "--rank", "0", "--world", "1"};
  spec.output_path = tmp.file("out.log");
  auto proc = local_process::spawn(spec);
  ASSERT_TRUE(proc);
  auto st = proc->wait_for(10000);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->code, 2);
}
