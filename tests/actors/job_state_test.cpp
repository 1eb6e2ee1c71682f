// The job's event vocabulary (JSON and CAF wire forms) and its state machine.
#include "actors/actor_system.hpp"
#include "actors/job/job_actor.hpp"
#include "actors/job/metrics_sink.hpp"
#include "runtime/file_io.hpp"
#include "tests/support/caf_round_trip.hpp"
#include "tests/support/temp_dir.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>

#include <cmath>
#include <set>

using namespace troupe;
using namespace troupe::actors::job;

namespace {

// One event of every kind, every field away from its default.
std::vector<event> one_of_each() {
  std::vector<event_body> bodies{
      state_changed{job_state::running, job_state::paused, "at rl step 2 after adv"},
      stage_started{"rl", 10, 3},
      stage_finished{"sft", 300, 12.5, true},
      phase_started{"rl", 4, "gen"},
      phase_finished{"rl", 4, "gen", 0.25, false},
      metrics_reported{"rl", 4, 10, {{"critic/score/mean", 0.5}, {"actor/ppo_kl", -1e-9}}},
      weight_synced{"rl", 4, "shm", 123456, 0.01, "policy", "rollout", 140000, 123456},
      checkpoint_saved{"rl", 4, "/x/rl/checkpoints/iter_00000004", 999, 0.2},
      role_changed{"rl", "critic", 1, "worker 2", 4242, "failed", "critic: values: boom", 9,
                   "values"},
      eval_samples{
          "rl",
          4,
          {{"sort 321", "123", 1.0},
           {"sort 54", "\"45\"\n", 0.5,
            R"([{"role":"user","content":"sort 54"},{"role":"assistant","content":"45","turn":1}])"}}},
      log_line{"warn", "a line with \"quotes\" and ünïcode"},
      setting_updated{"rl.kl.coef", "0.2", "0.05", 5},
  };
  std::vector<event> out;
  int64_t seq = 1;
  for (auto& b : bodies)
    out.push_back(event{seq++, 1795000000000000 + seq, std::move(b)});
  return out;
}

} // namespace

TEST(JobEvents, EveryKindRoundTripsThroughItsJsonLine) {
  auto all = one_of_each();
  ASSERT_EQ(all.size(), std::variant_size_v<event_body>) << "one_of_each misses a kind";
  std::set<std::string_view> kinds;
  for (const auto& e : all) {
    auto line = to_json(e);
    auto back = event_from_json(line);
    ASSERT_TRUE(back) << describe(back.error()) << "\n" << line;
    EXPECT_EQ(to_json(*back), line);
    EXPECT_EQ(back->body.index(), e.body.index());
    kinds.insert(kind_of(e.body));
    EXPECT_NE(line.find("\"kind\":\"" + std::string{kind_of(e.body)} + "\""), std::string::npos);
  }
  EXPECT_EQ(kinds.size(), all.size()) << "kind names must be distinct";
  EXPECT_EQ(event_kinds().size(), all.size());
}

TEST(JobEvents, WeightSyncsNameTheirRolesAndOlderLinesWithoutThemStillRead) {
  auto line = to_json(event{1, 2, weight_synced{"sft", 3, "alias", 10, 0.5, "policy", "rollout"}});
  EXPECT_NE(line.find(R"("from":"policy")"), std::string::npos) << line;
  EXPECT_NE(line.find(R"("to":"rollout")"), std::string::npos) << line;
  job_status st;
  track(st, event_from_json(line)->body);
  EXPECT_EQ(st.weight_versions, (std::map<std::string, int64_t>{{"policy", 3}, {"rollout", 3}}));

  // A journal line from before the roles were written: policy -> rollout.
  auto old = event_from_json(
      R"({"seq":4,"time_us":5,"kind":"weight_sync","stage":"rl","version":7,"transport":"shm","bytes":1,"seconds":0.1})");
  ASSERT_TRUE(old) << describe(old.error());
  EXPECT_EQ(std::get<weight_synced>(old->body).from, "");
  EXPECT_EQ(std::get<weight_synced>(old->body).publisher_temporary_bytes, 0);
  EXPECT_EQ(std::get<weight_synced>(old->body).receiver_temporary_bytes, 0);
  job_status st2;
  track(st2, old->body);
  EXPECT_EQ(st2.weight_versions, (std::map<std::string, int64_t>{{"policy", 7}, {"rollout", 7}}));

  // Present but of the wrong type is still an error.
  auto bad = event_from_json(
      R"({"seq":4,"time_us":5,"kind":"weight_sync","stage":"rl","version":7,"transport":"shm","bytes":1,"seconds":0.1,"from":3})");
  ASSERT_FALSE(bad);
  EXPECT_NE(describe(bad.error()).find("field \"from\" is not a string"), std::string::npos);
}

TEST(JobEvents, NonFiniteMetricsTravelAsNull) {
  event e{1, 2, metrics_reported{"rl", 1, 2, {{"x", NAN}}}};
  auto line = to_json(e);
  EXPECT_NE(line.find("\"x\":null"), std::string::npos) << line;
  auto back = event_from_json(line);
  ASSERT_TRUE(back);
  EXPECT_TRUE(std::isnan(std::get<metrics_reported>(back->body).metrics.at("x")));
}

TEST(JobEvents, MalformedLinesAreRefusedWithTheReason) {
  struct bad_case {
    const char* line;
    const char* says;
  };
  for (
      auto c :
      {bad_case{"not json", "not a JSON object"}, bad_case{R"({"seq":1,"time_us":2})", "kind"},
       bad_case{R"({"seq":1,"time_us":2,"kind":"nope"})", "unknown kind \"nope\""},
       bad_case{
           R"({"seq":1,"time_us":2,"kind":"stage_started","stage":"rl","total":"x","from_step":0})",
           "field \"total\" is not an integer"},
       bad_case{R"({"seq":3,"time_us":2,"kind":"phase_started","stage":"rl","iteration":1})",
                "missing field \"phase\""},
       bad_case{
           R"({"seq":1,"time_us":2,"kind":"state","from":"running","to":"sleeping","reason":""})",
           "field \"to\" is not a job state"}}) {
    auto e = event_from_json(c.line);
    ASSERT_FALSE(e) << c.line;
    EXPECT_EQ(code_of(e.error()), errc::parse_error);
    EXPECT_NE(describe(e.error()).find(c.says), std::string::npos) << describe(e.error());
  }
}

TEST(JobEvents, EventsAndStatusCrossProcessesThroughCafsSerialiser) {
  caf::actor_system_config cfg;
  troupe::actors::configure(cfg);
  caf::actor_system sys{cfg};
  for (auto e : one_of_each()) {
    EXPECT_EQ(to_json(troupe::test::round_trip(sys, e)), to_json(e));
  }
  job_status st;
  st.id = "7-1";
  st.state = job_state::paused;
  st.stage = "rl";
  st.iteration = 3;
  st.weight_versions["rollout"] = 3;
  auto back = troupe::test::round_trip(sys, st);
  EXPECT_EQ(back.state, job_state::paused);
  EXPECT_EQ(back.weight_versions.at("rollout"), 3);
}

TEST(JobStates, TheDiagramsEdgesAndNoOthers) {
  using s = job_state;
  const std::vector<s> all{s::pending,   s::preparing, s::running,  s::paused,
                           s::succeeded, s::failed,    s::cancelled};
  const std::set<std::pair<s, s>> edges{
      {s::pending, s::preparing}, {s::pending, s::cancelled},   {s::preparing, s::running},
      {s::preparing, s::failed},  {s::preparing, s::cancelled}, {s::running, s::paused},
      {s::running, s::succeeded}, {s::running, s::failed},      {s::running, s::cancelled},
      {s::paused, s::running},    {s::paused, s::succeeded},    {s::paused, s::failed},
      {s::paused, s::cancelled}};
  // Walk to each state along edges, then try every move from it.
  auto reach = [](job_fsm& f, s target) {
    const std::map<s, std::vector<s>> path{{s::pending, {}},
                                           {s::preparing, {s::preparing}},
                                           {s::running, {s::preparing, s::running}},
                                           {s::paused, {s::preparing, s::running, s::paused}},
                                           {s::succeeded, {s::preparing, s::running, s::succeeded}},
                                           {s::failed, {s::preparing, s::failed}},
                                           {s::cancelled, {s::cancelled}}};
    for (auto step : path.at(target))
      ASSERT_TRUE(f.move(step));
  };
  for (auto from : all)
    for (auto to : all) {
      job_fsm f;
      reach(f, from);
      auto ok = f.move(to);
      EXPECT_EQ(static_cast<bool>(ok), edges.count({from, to}) == 1)
          << to_string(from) << " -> " << to_string(to);
      if (!ok)
        EXPECT_EQ(code_of(ok.error()), errc::illegal_state);
    }
}

TEST(JobStates, CommandsAStateDoesNotAllowAreRefusedWithTheReason) {
  job_fsm f;
  EXPECT_TRUE(f.check(command::start));
  EXPECT_TRUE(f.check(command::cancel));
  auto r = f.check(command::resume);
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("cannot resume: the job is pending, not paused"),
            std::string::npos)
      << describe(r.error());
  ASSERT_TRUE(f.move(job_state::preparing) && f.move(job_state::running));
  EXPECT_FALSE(f.check(command::start));
  EXPECT_TRUE(f.check(command::pause));
  EXPECT_TRUE(f.check(command::update));
  r = f.check(command::resume);
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("running, not paused"), std::string::npos);
  ASSERT_TRUE(f.move(job_state::paused));
  EXPECT_TRUE(f.check(command::resume));
  EXPECT_FALSE(f.check(command::pause));
  ASSERT_TRUE(f.move(job_state::cancelled));
  for (auto c : {command::start, command::pause, command::resume, command::cancel,
                 command::checkpoint, command::update}) {
    auto x = f.check(c);
    ASSERT_FALSE(x) << to_string(c);
    EXPECT_EQ(code_of(x.error()), errc::illegal_state);
    EXPECT_NE(describe(x.error()).find("the job has finished (cancelled)"), std::string::npos);
  }
}

TEST(JobStates, BreakpointsParseAndBadOnesSayTheForm) {
  auto b = parse_breakpoint("rl:2:reward");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->stage, "rl");
  EXPECT_EQ(b->step, 2);
  EXPECT_EQ(b->phase, "reward");
  b = parse_breakpoint("sft:7");
  ASSERT_TRUE(b);
  EXPECT_EQ(b->phase, "");
  for (const char* bad : {"", "rl", ":2", "rl:", "rl:x", "rl:2:", "rl:-1"}) {
    auto x = parse_breakpoint(bad);
    ASSERT_FALSE(x) << bad;
    EXPECT_NE(describe(x.error()).find("STAGE:STEP[:PHASE]"), std::string::npos);
  }
}

TEST(MetricsSink, AResumedStageDropsTheLinesItWillWriteAgain) {
  test::temp_dir tmp;
  auto path = tmp.file("metrics.jsonl");
  ASSERT_TRUE(runtime::write_file_atomic(path,
                                         "{\"stage\":\"sft\",\"step\":1}\n{\"stage\":\"rl\","
                                         "\"step\":0}\n{\"stage\":\"rl\",\"step\":1}\n"
                                         "{\"stage\":\"rl\",\"step\":2}\n{\"stage\":\"rl\",\"st"));
  auto sink = metrics_sink::open(path, {"sft", "rl"});
  ASSERT_TRUE(sink);
  ASSERT_TRUE((**sink)(event{1, 1, stage_started{"rl", 5, 1}}));
  ASSERT_TRUE((**sink)(event{2, 1, metrics_reported{"rl", 2, 5, {{"m", 1}}}}));
  auto text = runtime::read_file(path);
  ASSERT_TRUE(text);
  EXPECT_EQ(*text, "{\"stage\":\"sft\",\"step\":1}\n{\"stage\":\"rl\",\"step\":0}\n"
                   "{\"stage\":\"rl\",\"step\":1}\n{\"m\":1.0,\"stage\":\"rl\",\"step\":2}\n");
}
