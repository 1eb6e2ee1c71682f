// The job actor driving real tiny jobs: its event stream and journal,
// commands in each state, runtime settings, failures, two jobs at once.
#include "tests/actors/job_harness.hpp"
#include "tests/support/temp_dir.hpp"

#include <future>

using namespace troupe;
using namespace troupe::actors;
using namespace troupe::actors::rl;
using namespace troupe::actors::rl::testing;

namespace {

job_config tiny(const std::string& dir, std::vector<std::string> sets = {}) {
  sets.insert(sets.begin(), {"stages=[rl]", "rl.critic.init=base"});
  auto cfg = parse_job(tiny_job(dir), sets);
  EXPECT_TRUE(cfg) << describe(cfg.error());
  return *cfg;
}

// Starts a tiny rl job that checkpoints only when told and waits until
// it is held at `where`.
void pause_without_checkpoints(job_harness& h, test::temp_dir& tmp, const std::string& where) {
  ASSERT_TRUE(h.spawn(tiny(tmp.file("run"), {"rl.checkpoint_every=0"})));
  ASSERT_TRUE(h.ask(job::pause_at_atom::value, where));
  ASSERT_TRUE(h.ask(job::start_atom::value));
  ASSERT_TRUE(h.events->wait_for_state(job::job_state::paused));
}

double coeff(const nlohmann::json& line) {
  return line["actor/reward_kl_penalty_coeff"].get<double>();
}

} // namespace

TEST(JobControl, TheStreamIsContiguousBalancedAndEqualsTheJournal) {
  test::temp_dir tmp;
  job_harness h;
  ASSERT_TRUE(h.spawn(tiny(tmp.file("run"), {"stages=[sft, rl]"})));
  ASSERT_TRUE(h.ask(job::start_atom::value));
  auto end = h.await();
  ASSERT_TRUE(end) << describe(end.error());
  EXPECT_EQ(end->state, job::job_state::succeeded) << end->error;
  ASSERT_TRUE(h.events->wait_for_state(job::job_state::succeeded));
  auto events = h.events->snapshot();
  ASSERT_FALSE(events.empty());
  // Contiguous from 1; the states in the diagram's order.
  std::vector<job::job_state> states;
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].seq, static_cast<int64_t>(i + 1));
    if (auto* c = std::get_if<job::state_changed>(&events[i].body))
      states.push_back(c->to);
  }
  EXPECT_EQ(states, (std::vector<job::job_state>{job::job_state::preparing, job::job_state::running,
                                                 job::job_state::succeeded}));
  // Every phase_started is closed by its phase_finished before the next one.
  std::optional<job::phase_started> open;
  size_t phases = 0;
  for (const auto& e : events) {
    if (auto* p = std::get_if<job::phase_started>(&e.body)) {
      EXPECT_FALSE(open) << "phase " << p->phase << " started inside " << open->phase;
      open = *p;
      ++phases;
    } else if (auto* f = std::get_if<job::phase_finished>(&e.body)) {
      ASSERT_TRUE(open) << "phase " << f->phase << " finished without a start";
      EXPECT_EQ(f->phase, open->phase);
      EXPECT_EQ(f->iteration, open->iteration);
      EXPECT_TRUE(f->ok);
      open.reset();
    }
  }
  EXPECT_FALSE(open);
  EXPECT_GT(phases, 3u * 8u); // 3 sft steps + 3 rl iterations of 9 phases
  // The journal equals the stream, line by line.
  auto journal = h.journal();
  ASSERT_EQ(journal.size(), events.size());
  for (size_t i = 0; i < events.size(); ++i)
    EXPECT_EQ(journal[i], nlohmann::json::parse(job::to_json(events[i]))) << "event " << i + 1;
  // metrics.jsonl holds exactly the metrics events; weight syncs and
  // checkpoints were announced.
  EXPECT_EQ(h.metrics().size(), h.events->count([](const job::event& e) {
    return std::holds_alternative<job::metrics_reported>(e.body);
  }));
  EXPECT_EQ(h.events->count([](const job::event& e) {
    auto* w = std::get_if<job::weight_synced>(&e.body);
    return w && w->stage == "rl" && w->transport == "alias";
  }),
            3u);
  EXPECT_GE(h.events->count([](const job::event& e) {
    return std::holds_alternative<job::checkpoint_saved>(e.body);
  }),
            3u);
  EXPECT_GT(h.events->count(
                [](const job::event& e) { return std::holds_alternative<job::log_line>(e.body); }),
            0u);
  EXPECT_TRUE(std::filesystem::exists(tmp.path() / "run" / "troupe.log"));
  // A late subscriber from N gets exactly the events from N on.
  auto late = std::make_shared<event_log>();
  auto rec = h.system().spawn(recorder, late);
  auto from = static_cast<int64_t>(events.size()) - 20;
  auto next = h.subscribe(rec, from);
  ASSERT_TRUE(next);
  EXPECT_EQ(*next, static_cast<int64_t>(events.size()) + 1);
  ASSERT_TRUE(late->wait_for_state(job::job_state::succeeded, std::chrono::seconds(30)));
  auto got = late->snapshot();
  ASSERT_EQ(got.size(), 21u);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(job::to_json(got[i]), job::to_json(events[static_cast<size_t>(from - 1) + i]));
  // Status after the end.
  auto st = h.ask(job::status_atom::value);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->state, job::job_state::succeeded);
  EXPECT_EQ(st->stage, "rl");
  EXPECT_EQ(st->iteration, 3);
  EXPECT_EQ(st->total, 3);
  EXPECT_EQ(st->weight_versions.at("rollout"), 3);
  EXPECT_TRUE(st->last_metrics.count("val/score/mean"));
  EXPECT_EQ(st->last_seq, static_cast<int64_t>(events.size()));
}

TEST(JobControl, IllegalCommandsAreRefusedAndAFinishedJobSaysSo) {
  test::temp_dir tmp;
  job_harness h;
  ASSERT_TRUE(h.spawn(tiny(tmp.file("run"), {"rl.iterations=1"})));
  auto r = h.ask(job::resume_atom::value);
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::illegal_state);
  EXPECT_NE(describe(r.error()).find("pending, not paused"), std::string::npos);
  ASSERT_FALSE(h.ask(job::pause_atom::value));
  ASSERT_TRUE(h.ask(job::pause_at_atom::value, std::string{"rl:1:gen"}));
  ASSERT_TRUE(h.ask(job::start_atom::value));
  r = h.ask(job::start_atom::value);
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::illegal_state);
  ASSERT_TRUE(h.events->wait_for_state(job::job_state::paused));
  auto st = h.ask(job::status_atom::value);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->state, job::job_state::paused);
  EXPECT_EQ(st->stage, "rl");
  r = h.ask(job::pause_atom::value);
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("already paused"), std::string::npos);
  ASSERT_TRUE(h.ask(job::resume_atom::value));
  r = h.ask(job::resume_atom::value);
  if (!r) { // unless the job already finished, it is running now
    EXPECT_EQ(code_of(r.error()), errc::illegal_state);
  }
  auto end = h.await();
  ASSERT_TRUE(end);
  EXPECT_EQ(end->state, job::job_state::succeeded) << end->error;
  for (auto c : {h.ask(job::pause_atom::value), h.ask(job::resume_atom::value),
                 h.ask(job::cancel_atom::value, false), h.ask(job::checkpoint_atom::value),
                 h.ask(job::update_atom::value, std::string{"rl.kl.coef"}, std::string{"0.1"})}) {
    ASSERT_FALSE(c);
    EXPECT_EQ(code_of(c.error()), errc::illegal_state);
    EXPECT_NE(describe(c.error()).find("the job has finished (succeeded)"), std::string::npos)
        << describe(c.error());
  }
  EXPECT_TRUE(h.ask(job::status_atom::value));
}

TEST(JobControl, AnUpdateTakesEffectNextIterationIsAnEventAndSurvivesResume) {
  test::temp_dir tmp;
  auto cfg = tiny(tmp.file("run"), {"rl.iterations=4"});
  {
    job_harness h;
    ASSERT_TRUE(h.spawn(cfg));
    ASSERT_TRUE(h.ask(job::pause_at_atom::value, std::string{"rl:1:reward"}));
    ASSERT_TRUE(h.ask(job::pause_at_atom::value, std::string{"rl:4"}));
    ASSERT_TRUE(h.ask(job::start_atom::value));
    ASSERT_TRUE(h.events->wait_for_state(job::job_state::paused));
    // Refused: nothing changes.
    for (auto [key, value, says] :
         {std::tuple{"rl.kl.coef", "-1", "rl.kl.coef"},
          std::tuple{"rl.kl.coef", "abc", "rl.kl.coef"},
          std::tuple{"rl.epochs", "3", "not a runtime setting"},
          std::tuple{"rl.generation.top_p", "1.5", "rl.generation.top_p"}}) {
      auto r = h.ask(job::update_atom::value, std::string{key}, std::string{value});
      ASSERT_FALSE(r) << key << "=" << value;
      EXPECT_NE(describe(r.error()).find(says), std::string::npos) << describe(r.error());
    }
    ASSERT_TRUE(h.ask(job::update_atom::value, std::string{"rl.kl.coef"}, std::string{"0.2"}));
    ASSERT_TRUE(h.ask(job::resume_atom::value));
    // Paused again before iteration 4: cancel with a checkpoint (of iteration 3).
    ASSERT_TRUE(h.events->wait_for([](const job::event& e) {
      auto* c = std::get_if<job::state_changed>(&e.body);
      return c && c->to == job::job_state::paused && c->reason.find("step 4") != std::string::npos;
    }));
    ASSERT_TRUE(h.ask(job::cancel_atom::value, false));
    auto end = h.await();
    ASSERT_TRUE(end);
    EXPECT_EQ(end->state, job::job_state::cancelled) << end->error;
    auto rl = deterministic_rl(h.metrics());
    ASSERT_EQ(rl.size(), 4u); // step 0 + iterations 1..3
    EXPECT_DOUBLE_EQ(coeff(rl[1]), 0.05);
    EXPECT_DOUBLE_EQ(coeff(rl[2]), 0.2);
    EXPECT_DOUBLE_EQ(coeff(rl[3]), 0.2);
    EXPECT_EQ(h.events->count([](const job::event& e) {
      auto* s = std::get_if<job::setting_updated>(&e.body);
      return s && s->key == "rl.kl.coef" && s->value == "0.2" && s->iteration == 2 &&
             s->previous == "0.05";
    }),
              1u);
  }
  run_options resume;
  resume.resume = true;
  job_harness h;
  ASSERT_TRUE(h.spawn(cfg, resume));
  ASSERT_TRUE(h.ask(job::start_atom::value));
  auto end = h.await();
  ASSERT_TRUE(end);
  EXPECT_EQ(end->state, job::job_state::succeeded) << end->error;
  auto rl = deterministic_rl(h.metrics());
  ASSERT_EQ(rl.size(), 5u);
  EXPECT_DOUBLE_EQ(coeff(rl[4]), 0.2);
  // The journal of the resumed run numbers on.
  auto journal = h.journal();
  for (size_t i = 1; i < journal.size(); ++i)
    EXPECT_EQ(journal[i]["seq"].get<int64_t>(), journal[i - 1]["seq"].get<int64_t>() + 1);
}

TEST(JobControl, ARoleFailureFailsTheJobNamingRolePhaseAndIteration) {
  test::temp_dir tmp;
  job_harness h;
  ASSERT_TRUE(
      h.spawn(tiny(tmp.file("run"), {"debug.fail_role=critic", "debug.fail_phase=update_critic",
                                     "debug.fail_iteration=2"})));
  ASSERT_TRUE(h.ask(job::start_atom::value));
  auto end = h.await();
  ASSERT_TRUE(end);
  EXPECT_EQ(end->state, job::job_state::failed);
  for (const char* part : {"rl iteration 2", "update_critic", "critic: ", "injected failure"})
    EXPECT_NE(end->error.find(part), std::string::npos) << end->error;
  ASSERT_TRUE(h.events->wait_for_state(job::job_state::failed));
  EXPECT_EQ(h.events->count([](const job::event& e) {
    auto* r = std::get_if<job::role_changed>(&e.body);
    return r && r->role == "critic" && r->status == "failed" && r->phase == "update_critic" &&
           r->process == "driver" && r->pid == ::getpid();
  }),
            1u);
}

TEST(JobControl, ACheckpointWhilePausedIsWrittenAtOnce) {
  test::temp_dir tmp;
  job_harness h;
  ASSERT_NO_FATAL_FAILURE(pause_without_checkpoints(h, tmp, "rl:2:values"));
  ASSERT_TRUE(h.ask(job::checkpoint_atom::value));
  ASSERT_TRUE(h.events->wait_for([](const job::event& e) {
    auto* c = std::get_if<job::checkpoint_saved>(&e.body);
    return c && c->stage == "rl" && c->step == 1 && c->bytes > 0;
  }));
  auto st = h.ask(job::status_atom::value);
  ASSERT_TRUE(st);
  EXPECT_EQ(st->state, job::job_state::paused);
  ASSERT_TRUE(h.ask(job::resume_atom::value));
  auto end = h.await();
  ASSERT_TRUE(end);
  EXPECT_EQ(end->state, job::job_state::succeeded);
}

// Resumed while the checkpoint asked for in the pause is still being
// written: the driver comes back to the boundary and must go on, not be
// held again under a job that says it is running.
TEST(JobControl, AResumeRightAfterACheckpointWhilePausedGoesOn) {
  test::temp_dir tmp;
  job_harness h;
  ASSERT_NO_FATAL_FAILURE(pause_without_checkpoints(h, tmp, "rl:2:values"));
  ASSERT_TRUE(h.ask(job::checkpoint_atom::value));
  auto st = h.ask(job::resume_atom::value);
  ASSERT_TRUE(st) << describe(st.error());
  EXPECT_EQ(st->state, job::job_state::running);
  auto end = h.await(std::chrono::seconds(120));
  ASSERT_TRUE(end) << describe(end.error());
  EXPECT_EQ(end->state, job::job_state::succeeded) << end->error;
  EXPECT_EQ(h.events->count([](const job::event& e) {
    auto* c = std::get_if<job::checkpoint_saved>(&e.body);
    return c && c->stage == "rl" && c->step == 1;
  }),
            1u);
}

TEST(JobControl, CancelNowStopsWithoutACheckpoint) {
  test::temp_dir tmp;
  job_harness h;
  ASSERT_NO_FATAL_FAILURE(pause_without_checkpoints(h, tmp, "rl:2:update_actor"));
  ASSERT_TRUE(h.ask(job::cancel_atom::value, true));
  auto end = h.await();
  ASSERT_TRUE(end);
  EXPECT_EQ(end->state, job::job_state::cancelled);
  EXPECT_EQ(h.events->count([](const job::event& e) {
    return std::holds_alternative<job::checkpoint_saved>(e.body);
  }),
            0u);
  EXPECT_FALSE(std::filesystem::exists(tmp.path() / "run" / "rl" / "checkpoints" / "latest"));
}

TEST(JobControl, TwoJobsInOneProcessEachGiveTheirSoloMetrics) {
  test::temp_dir tmp;
  // Shared memory names every channel: two jobs must not meet in them.
  auto a = tiny(tmp.file("a"), {"weight_sync.transport=shm"});
  auto b = tiny(tmp.file("b"), {"weight_sync.transport=shm", "run.seed=5"});
  auto solo = [&](const job_config& c) {
    job_harness h;
    EXPECT_TRUE(h.spawn(c));
    EXPECT_TRUE(h.ask(job::start_atom::value));
    auto end = h.await();
    EXPECT_TRUE(end && end->state == job::job_state::succeeded);
    return deterministic_rl(h.metrics());
  };
  auto a1 = solo(a);
  auto b1 = solo(b);
  ASSERT_EQ(a1.size(), 4u);
  ASSERT_NE(a1, b1);
  std::filesystem::remove_all(tmp.path() / "a");
  std::filesystem::remove_all(tmp.path() / "b");
  job_harness h;
  auto ja = spawn_rl_job(h.system(), a, {});
  auto jb = spawn_rl_job(h.system(), b, {});
  ASSERT_TRUE(ja && jb);
  caf::scoped_actor self{h.system()};
  for (auto* j : {&*ja, &*jb})
    self->request(j->actor, std::chrono::seconds(30), job::start_atom::value)
        .receive([](job::job_status&) {}, [](caf::error& e) { FAIL() << caf::to_string(e); });
  for (auto* j : {&*ja, &*jb}) {
    self->request(j->actor, std::chrono::seconds(300), job::await_atom::value)
        .receive(
            [](job::job_status& s) { EXPECT_EQ(s.state, job::job_state::succeeded) << s.error; },
            [](caf::error& e) { FAIL() << caf::to_string(e); });
    self->send_exit(j->actor, caf::exit_reason::user_shutdown);
  }
  EXPECT_EQ(deterministic_rl(job_harness::jsonl(a.run.dir + "/metrics.jsonl")), a1);
  EXPECT_EQ(deterministic_rl(job_harness::jsonl(b.run.dir + "/metrics.jsonl")), b1);
}
