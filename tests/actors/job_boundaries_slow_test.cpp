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

job_config ppo(const std::string& dir) {
  auto cfg =
      parse_job(tiny_job(dir), {"stages=[rl]", "rl.critic.init=base", "rl.checkpoint_every=0"});
  EXPECT_TRUE(cfg) << describe(cfg.error());
  return *cfg;
}

std::string weights(const std::string& dir) {
  auto w = runtime::read_file(dir + "/rl/model/model.safetensors");
  EXPECT_TRUE(w) << dir;
  return w ? *w : std::string{};
}

std::string breakpoint_at(const std::string& phase) {
  return "rl:2" + (phase.empty() ? "" : ":" + phase);
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

TEST(JobBoundaries, CancelAndResumeAtEveryBoundaryOfAStepChangesNothing) {
  test::temp_dir tmp;
  auto straight = run(ppo(tmp.file("a")), {});
  for (const auto& phase : boundaries) {
    auto dir = tmp.file("cancel-" + (phase.empty() ? std::string{"start"} : phase));
    auto cfg = ppo(dir);
    {
      job_harness h;
      ASSERT_TRUE(h.spawn(cfg));
      ASSERT_TRUE(h.ask(job::pause_at_atom::value, breakpoint_at(phase)));
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
