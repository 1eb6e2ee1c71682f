// NOTE [supervision by events]: the watch wakes its owner when a watched
// process ends (child or not) or a file lands in a watched folder, and a
// controller with nothing to do sleeps.
#include "cluster/controller.hpp"
#include "cluster/local_launcher.hpp"
#include "cluster/process_watch.hpp"
#include "cluster/workers.hpp"
#include "runtime/file_io.hpp"
#include "tests/support/temp_dir.hpp"

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <mutex>
#include <thread>

using namespace troupe;
using namespace troupe::cluster;
using namespace std::chrono_literals;

namespace {

// Counts the news and lets the test wait for the next one.
struct news_counter {
  std::mutex mu;
  std::condition_variable cv;
  int count = 0;
  std::thread::id last_caller;
  void operator()() {
    std::lock_guard lock{mu};
    ++count;
    last_caller = std::this_thread::get_id();
    cv.notify_all();
  }
  bool wait_beyond(int seen, std::chrono::milliseconds limit) {
    std::unique_lock lock{mu};
    return cv.wait_for(lock, limit, [&] { return count > seen; });
  }
  int now() {
    std::lock_guard lock{mu};
    return count;
  }
};

} // namespace

TEST(ProcessWatch, AProcessThatEndsAndAFileThatLandsAreNews) {
  test::temp_dir tmp;
  news_counter news;
  process_watch watch{[&] { news(); }};
  auto p = local_process::spawn({"sleeper", {"/bin/sleep", "30"}, {}, {}});
  ASSERT_TRUE(p);
  ASSERT_TRUE(watch.watch_process(p->pid()));
  ASSERT_TRUE(watch.watch_folder(tmp.path().string()));
  // Quiet while nothing happens.
  int before = news.now();
  EXPECT_FALSE(news.wait_beyond(before, 300ms));
  // The process ends: news, promptly.
  auto t0 = std::chrono::steady_clock::now();
  p->kill(SIGKILL);
  ASSERT_TRUE(news.wait_beyond(before, 5s)) << "no news of the process's end";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  ASSERT_TRUE(p->wait_for(5000));
  // A file renamed into the folder (write_file_atomic): news.
  before = news.now();
  ASSERT_TRUE(runtime::write_file_atomic(tmp.file("driver.json"), "{}"));
  ASSERT_TRUE(news.wait_beyond(before, 5s)) << "no news of the file";
  // Forgotten folders are quiet again; an ended pid reports at once.
  watch.forget_folder(tmp.path().string());
  watch.forget_process(p->pid());
  std::this_thread::sleep_for(100ms);
  before = news.now();
  ASSERT_TRUE(runtime::write_file_atomic(tmp.file("workers.json"), "{}"));
  EXPECT_FALSE(news.wait_beyond(before, 300ms));
  ASSERT_TRUE(watch.watch_process(p->pid())); // reaped: gone already
  EXPECT_TRUE(news.wait_beyond(before, 1s));
  // Told from the watch's thread, never inside the caller's call (which may
  // hold the lock the callback takes).
  EXPECT_NE(news.last_caller, std::this_thread::get_id());
  EXPECT_FALSE(watch.watch_folder(tmp.file("missing")));
}

TEST(Supervision, AnIdleControllerSleepsInsteadOfPolling) {
  test::temp_dir tmp;
  caf::actor_system_config cfg;
  configure_network(cfg);
  caf::actor_system sys{cfg};
  controller_options o;
  o.state_dir = tmp.file("state");
  o.executable = "/bin/false";
  auto ctl = controller::open(sys, o);
  ASSERT_TRUE(ctl) << describe(ctl.error());
  std::this_thread::sleep_for(200ms);
  auto before = (*ctl)->supervisor_rounds();
  std::this_thread::sleep_for(1s);
  // A 50 ms poll would have looked 20 times.
  EXPECT_LE((*ctl)->supervisor_rounds() - before, 1);
  (*ctl)->shutdown();
}
