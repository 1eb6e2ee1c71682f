// NOTE [job actor failures]: what fails inside the job actor — a sink that
// throws or errs, an exception escaping a handler — fails the job promptly
// with its message, stops the driver at its next boundary, and leaves the
// journal and the metrics file intact up to that point. A driver of steps
// (no model) stands in for the stages, so each case runs in milliseconds.
#include "actors/actor_system.hpp"
#include "actors/job/job_actor.hpp"
#include "actors/job/metrics_sink.hpp"
#include "tests/actors/job_harness.hpp"
#include "tests/support/temp_dir.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <fstream>
#include <stdexcept>
#include <thread>

using namespace troupe;
using namespace troupe::actors;
using namespace std::chrono_literals;

namespace {

// A driver of 2 ms steps that would run for minutes: one stopped within a
// second of the failure (kSoon steps) was stopped by it, under any load.
constexpr int kSteps = 100000;
constexpr int kSoon = 500;

// What the stand-in driver did, read by the test.
struct driver_record {
  std::atomic<int> steps{0};
  std::atomic<bool> ended{false};
  std::string end; // written before `ended`
};

// Up to `steps` steps of stage "rl": a metrics event per step and a
// boundary after it, as the real stages do (NOTE [job boundaries]); each
// step takes `step_time`.
job::driver_fn step_driver(std::shared_ptr<driver_record> rec, int steps,
                           std::chrono::milliseconds step_time = 2ms) {
  return [=](caf::blocking_actor* self, job::driver_link& link) -> job::driver_outcome {
    auto finish = [&](job::driver_outcome out) {
      rec->end = std::string{to_string(out.state)} + ": " + out.error;
      rec->ended = true;
      return out;
    };
    link.emit(job::stage_started{"rl", steps, 0});
    link.prepared();
    for (int i = 1; i <= steps; ++i) {
      std::this_thread::sleep_for(step_time);
      link.emit(job::metrics_reported{"rl", i, steps, {{"score", 0.5 * i}}});
      rec->steps = i;
      auto orders = link.boundary(self, {"rl", i, "update_actor", true});
      if (!orders)
        return finish({job::job_state::failed, describe(orders.error())});
      if (orders->cancel)
        return finish({job::job_state::cancelled, ""});
    }
    return finish({job::job_state::succeeded, ""});
  };
}

std::vector<nlohmann::json> jsonl(const std::filesystem::path& path) {
  return rl::testing::job_harness::jsonl(path.string());
}

struct system_fixture {
  system_fixture() : sys((configure(cfg), cfg)) {}
  // A job actor lives until told to go (its driver holds a handle).
  ~system_fixture() {
    for (const auto& j : jobs)
      caf::anon_send_exit(j, caf::exit_reason::user_shutdown);
  }
  job::job_actor spawn(job::job_options o) { return jobs.emplace_back(job::spawn_job(sys, std::move(o))); }
  caf::actor_system_config cfg;
  caf::actor_system sys;
  std::vector<job::job_actor> jobs;
};

expected<job::job_status> ask(caf::actor_system& sys, const job::job_actor& job, auto atom,
                              auto... xs) {
  caf::scoped_actor self{sys};
  expected<job::job_status> out = make_error(errc::internal, "no reply");
  self->request(job, 30s, atom, xs...)
      .receive([&](job::job_status& s) { out = std::move(s); },
               [&](caf::error& e) { out = std::move(e); });
  return out;
}

// Starts the job and waits for its end: the final status, failed.
job::job_status run_to_failure(system_fixture& f, const job::job_actor& job) {
  EXPECT_TRUE(ask(f.sys, job, job::start_atom::value));
  auto end = ask(f.sys, job, job::await_atom::value);
  EXPECT_TRUE(end) << describe(end.error());
  if (!end)
    return {};
  EXPECT_EQ(end->state, job::job_state::failed);
  return *end;
}

bool wait_until(const std::atomic<bool>& flag, std::chrono::seconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!flag && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(1ms);
  return flag;
}

// A job whose runtime-settings check throws `what` (an update then throws
// inside the job actor), with a driver of a million 1 ms steps.
job::job_actor throwing_update_job(system_fixture& f, const test::temp_dir& tmp,
                                   std::shared_ptr<driver_record> rec, std::string what) {
  job::job_options o;
  o.id = "throws";
  o.journal_path = tmp.file("events.jsonl");
  o.check_update = [what](const std::string&, const std::string&) -> expected<std::string> {
    throw std::logic_error(what);
  };
  o.driver = step_driver(std::move(rec), 1000000, 1ms);
  return f.spawn(std::move(o));
}

// The driver found its job actor gone at a boundary and failed.
void expect_driver_failed_on_the_gone_actor(const driver_record& rec) {
  ASSERT_TRUE(wait_until(rec.ended, 10s)) << "the driver ran on after its job actor ended";
  EXPECT_EQ(rec.end.rfind("failed: ", 0), 0u) << rec.end;
  EXPECT_NE(rec.end.find("job actor: "), std::string::npos) << rec.end;
}


// Every line of the journal in sequence; the last one the failed state.
void expect_journal_ends_failed(const std::filesystem::path& path, const std::string& says) {
  auto journal = jsonl(path);
  ASSERT_FALSE(journal.empty());
  for (size_t i = 0; i < journal.size(); ++i)
    EXPECT_EQ(journal[i]["seq"].get<int64_t>(), static_cast<int64_t>(i + 1));
  const auto& last = journal.back();
  EXPECT_EQ(last["kind"], "state") << last;
  EXPECT_EQ(last["to"], "failed") << last;
  EXPECT_NE(last["reason"].get<std::string>().find(says), std::string::npos) << last;
}

} // namespace

TEST(JobFailure, ASinkThatThrowsFailsTheJobStopsTheDriverAndKeepsWhatWasWritten) {
  test::temp_dir tmp;
  system_fixture f;
  auto rec = std::make_shared<driver_record>();
  auto metrics = job::metrics_sink::open(tmp.file("metrics.jsonl"), {"rl"});
  ASSERT_TRUE(metrics) << describe(metrics.error());
  job::job_options o;
  o.id = "sink-throws";
  o.journal_path = tmp.file("events.jsonl");
  o.sinks.push_back([m = *metrics](const job::event& e) { return (*m)(e); });
  o.sinks.push_back([calls = 0](const job::event& e) mutable -> expected<void> {
    if (std::holds_alternative<job::metrics_reported>(e.body) && ++calls == 3)
      throw std::runtime_error("the dashboard's socket is gone");
    return {};
  });
  o.driver = step_driver(rec, kSteps);
  auto end = run_to_failure(f, f.spawn(std::move(o)));
  EXPECT_NE(end.error.find("a sink threw: the dashboard's socket is gone"), std::string::npos) << end.error;
  // The driver was stopped at a boundary soon after the failing step (the
  // job actor reads events a little behind it), not run to its end.
  ASSERT_TRUE(wait_until(rec->ended, 10s));
  EXPECT_LE(rec->steps.load(), kSoon) << rec->end;
  EXPECT_EQ(rec->end, "cancelled: ");
  expect_journal_ends_failed(tmp.path() / "events.jsonl", "a sink threw");
  // The metrics file holds every step the job actor saw, whole lines only.
  auto lines = jsonl(tmp.path() / "metrics.jsonl");
  ASSERT_GE(lines.size(), 3u);
  for (size_t i = 0; i < lines.size(); ++i)
    EXPECT_EQ(lines[i]["step"].get<int64_t>(), static_cast<int64_t>(i + 1));
}

TEST(JobFailure, ASinkErrorFailsTheJobAtOnceNotAtItsEnd) {
  test::temp_dir tmp;
  system_fixture f;
  auto rec = std::make_shared<driver_record>();
  job::job_options o;
  o.id = "sink-errs";
  o.journal_path = tmp.file("events.jsonl");
  o.sinks.push_back([calls = 0](const job::event& e) mutable -> expected<void> {
    if (std::holds_alternative<job::metrics_reported>(e.body) && ++calls == 2)
      return make_error(errc::io_error, "metrics.jsonl: No space left on device");
    return {};
  });
  o.driver = step_driver(rec, kSteps);
  auto end = run_to_failure(f, f.spawn(std::move(o)));
  EXPECT_NE(end.error.find("No space left on device"), std::string::npos) << end.error;
  ASSERT_TRUE(wait_until(rec->ended, 10s));
  EXPECT_LE(rec->steps.load(), kSoon);
  expect_journal_ends_failed(tmp.path() / "events.jsonl", "No space left on device");
}

TEST(JobFailure, AnExceptionInTheJobActorFailsTheJobAndTheDriverStopsAtItsNextBoundary) {
  test::temp_dir tmp;
  system_fixture f;
  auto rec = std::make_shared<driver_record>();
  auto job = throwing_update_job(f, tmp, rec, "settings book corrupted");
  ASSERT_TRUE(ask(f.sys, job, job::start_atom::value));
  // An awaiter from before the exception gets the failed status, not a
  // dead actor's error.
  caf::scoped_actor waiter{f.sys};
  auto awaiting = waiter->request(job, 30s, job::await_atom::value);
  while (rec->steps < 3)
    std::this_thread::sleep_for(1ms);
  auto update = ask(f.sys, job, job::update_atom::value, std::string{"rl.kl.coef"}, std::string{"0.1"});
  ASSERT_FALSE(update);
  EXPECT_NE(describe(update.error()).find("job actor: settings book corrupted"), std::string::npos)
      << describe(update.error());
  expected<job::job_status> end = make_error(errc::internal, "no reply");
  awaiting.receive([&](job::job_status& s) { end = std::move(s); },
                   [&](caf::error& e) { end = std::move(e); });
  ASSERT_TRUE(end) << describe(end.error());
  EXPECT_EQ(end->state, job::job_state::failed);
  EXPECT_NE(end->error.find("job actor: settings book corrupted"), std::string::npos) << end->error;
  // The driver finds the actor gone at its next boundary and ends.
  expect_driver_failed_on_the_gone_actor(*rec);
  expect_journal_ends_failed(tmp.path() / "events.jsonl", "settings book corrupted");
}

TEST(JobFailure, AnExceptionWhilePausedReleasesTheHeldDriver) {
  test::temp_dir tmp;
  system_fixture f;
  auto rec = std::make_shared<driver_record>();
  auto job = throwing_update_job(f, tmp, rec, "boom while paused");
  ASSERT_TRUE(ask(f.sys, job, job::pause_at_atom::value, std::string{"rl:2:update_actor"}));
  ASSERT_TRUE(ask(f.sys, job, job::start_atom::value));
  auto deadline = std::chrono::steady_clock::now() + 30s;
  for (;;) {
    auto st = ask(f.sys, job, job::status_atom::value);
    ASSERT_TRUE(st);
    if (st->state == job::job_state::paused)
      break;
    ASSERT_LT(std::chrono::steady_clock::now(), deadline);
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_FALSE(ask(f.sys, job, job::update_atom::value, std::string{"k"}, std::string{"v"}));
  expect_driver_failed_on_the_gone_actor(*rec);
  EXPECT_EQ(rec->steps.load(), 2) << "released from where it was held";
  expect_journal_ends_failed(tmp.path() / "events.jsonl", "boom while paused");
}
