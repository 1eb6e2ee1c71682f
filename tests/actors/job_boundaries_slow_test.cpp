// Pause / resume and cancel / --resume at every phase boundary of a PPO
// step change nothing: metrics and final weights are bit-identical to an
// uninterrupted run.
#include "tests/actors/job_harness.hpp"
#include "tests/support/temp_dir.hpp"

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::actors::rl;
using namespace troupe::actors::rl::testing;

namespace {

// The boundaries of a PPO step with a reference and a critic, in order.
const std::vector<std::string> boundaries{
    "",       "gen", "old_log_prob",  "ref",          "values",
    "reward", "adv", "update_critic", "update_actor", "weight_sync"};

job_config ppo(const std::string& dir, std::vector<std::string> more = {}) {
  std::vector<std::string> sets{"stages=[rl]", "rl.critic.init=base", "rl.checkpoint_every=0"};
  sets.insert(sets.end(), more.begin(), more.end());
  auto cfg = parse_job(tiny_job(dir), sets);
  EXPECT_TRUE(cfg) << describe(cfg.error());
  return *cfg;
}

// NOTE [paced rollout]: two batches ahead, in-flight updates at a pace of 3
// engine steps, 5 iterations (so step 3's boundaries find batches ahead
// mid-generation in the rollout).
job_config paced_async_ppo(const std::string& dir) {
  return ppo(dir, {"rl.iterations=5", "rl.staleness=2", "rl.inflight_updates=true",
                   "rl.inflight_steps=3", "rl.generation.max_tokens=12",
                   "rl.rollout.batch_invariant=true"});
}

std::string weights(const std::string& dir) {
  auto w = runtime::read_file(dir + "/rl/model/model.safetensors");
  EXPECT_TRUE(w) << dir;
  return w ? *w : std::string{};
}

std::string breakpoint_at(const std::string& phase, int step = 2) {
  return "rl:" + std::to_string(step) + (phase.empty() ? "" : ":" + phase);
}

struct run_out {
  std::vector<nlohmann::json> rl;
  std::string weights;
};

// Runs to the end, pausing at each breakpoint and resuming.
run_out run(const job_config& cfg, const std::vector<std::string>& pauses, run_options o = {}) {
  job_harness h;
  EXPECT_TRUE(h.spawn(cfg, o));
  for (const auto& p : pauses)
    EXPECT_TRUE(h.ask(job::pause_at_atom::value, breakpoint_at(p)));
  EXPECT_TRUE(h.ask(job::start_atom::value));
  for (size_t i = 1; i <= pauses.size(); ++i) {
    EXPECT_TRUE(h.events->wait_for_count(
        [](const job::event& x) {
          auto* c = std::get_if<job::state_changed>(&x.body);
          return c && c->to == job::job_state::paused;
        },
        i))
        << "pause " << i;
    EXPECT_TRUE(h.ask(job::resume_atom::value));
  }
  auto end = h.await();
  EXPECT_TRUE(end && end->state == job::job_state::succeeded) << (end ? end->error : "");
  return {deterministic_rl(h.metrics()), weights(cfg.run.dir)};
}

} // namespace

TEST(JobBoundaries, PauseAndResumeAtEveryBoundaryOfAStepChangesNothing) {
  test::temp_dir tmp;
  auto straight = run(ppo(tmp.file("a")), {});
  ASSERT_EQ(straight.rl.size(), 4u);
  auto paused = run(ppo(tmp.file("b")), boundaries);
  ASSERT_EQ(paused.rl.size(), straight.rl.size());
  for (size_t i = 0; i < straight.rl.size(); ++i)
    EXPECT_EQ(paused.rl[i], straight.rl[i]) << "line " << i;
  EXPECT_TRUE(paused.weights == straight.weights) << "final weights differ";
}

namespace {

// Cancelled at each of `phases` of step `step` (a run each) and resumed:
// every run equals the uninterrupted one.
void expect_cancel_and_resume_change_nothing(const test::temp_dir& tmp,
                                             job_config (*make)(const std::string&),
                                             const std::vector<std::string>& phases, int step) {
  auto straight = run(make(tmp.file("a")), {});
  for (const auto& phase : phases) {
    auto dir = tmp.file("cancel-" + (phase.empty() ? std::string{"start"} : phase));
    auto cfg = make(dir);
    {
      job_harness h;
      ASSERT_TRUE(h.spawn(cfg));
      ASSERT_TRUE(h.ask(job::pause_at_atom::value, breakpoint_at(phase, step)));
      ASSERT_TRUE(h.ask(job::start_atom::value));
      ASSERT_TRUE(h.events->wait_for_state(job::job_state::paused)) << phase;
      ASSERT_TRUE(h.ask(job::cancel_atom::value, false));
      auto end = h.await();
      ASSERT_TRUE(end);
      EXPECT_EQ(end->state, job::job_state::cancelled) << phase << ": " << end->error;
    }
    run_options resume;
    resume.resume = true;
    auto resumed = run(cfg, {}, resume);
    ASSERT_EQ(resumed.rl.size(), straight.rl.size()) << phase;
    for (size_t i = 0; i < straight.rl.size(); ++i)
      EXPECT_EQ(resumed.rl[i], straight.rl[i]) << phase << ": line " << i;
    EXPECT_TRUE(resumed.weights == straight.weights) << phase << ": final weights differ";
  }
}

} // namespace

TEST(JobBoundaries, CancelAndResumeAtEveryBoundaryOfAStepChangesNothing) {
  test::temp_dir tmp;
  expect_cancel_and_resume_change_nothing(
      tmp, [](const std::string& d) { return ppo(d); }, boundaries, 2);
}

// NOTE [paced rollout]: with two batches ahead and paced in-flight updates,
// a cancel at any boundary of step 3 — its checkpoint holding the rollout's
// batches mid-generation — and a resume give the uninterrupted run.
TEST(JobBoundaries, CancelAndResumeWithPacedInflightUpdatesChangesNothing) {
  test::temp_dir tmp;
  expect_cancel_and_resume_change_nothing(tmp, paced_async_ppo, boundaries, 3);
}
