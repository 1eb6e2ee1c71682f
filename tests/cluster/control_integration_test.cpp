// The control plane end to end: `troupe controller` and the CLI as real
// processes on ephemeral loopback ports (control_harness.hpp). Jobs are
// submitted, watched, paused, updated, resumed and cancelled; bad input
// gets the right status and says what and where; every call without the
// token is refused and changes nothing; a killed controller comes back with
// every record, and a killed driver fails its job within seconds.
#include "cluster/job_store.hpp"
#include "tests/cluster/control_harness.hpp"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <future>
#include <mutex>

using namespace troupe;
using namespace troupe::cluster;
namespace j = troupe::actors::job;

namespace {

std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

job_view get_job(api_client& api, const std::string& id) {
  auto v = api.get(id);
  EXPECT_TRUE(v) << describe(v.error());
  return v ? *v : job_view{};
}

// Waits until the job is in `s` (bounded).
bool reaches(api_client& api, const std::string& id, ctl_state s, double timeout_s = 120) {
  return test::eventually([&] { return get_job(api, id).state == s; }, timeout_s);
}

bool running_rl(api_client& api, const std::string& id) {
  return test::eventually(
      [&] {
        auto v = get_job(api, id);
        return v.state == ctl_state::running && v.status.stage == "rl" && v.status.iteration >= 1;
      },
      180);
}

} // namespace

TEST(Control, SubmitsWatchesAndReadsMetricsWithWaitExitCodes) {
  test::temp_dir tmp;
  test::controller_process ctl{tmp.file("state")};
  ctl.start();
  auto spec = tmp.write("job.yaml", test::tiny_spec(3));

  auto ok = ctl.cli({"submit", spec, "--wait", "--name", "first"});
  ASSERT_EQ(ok.code, 0) << ok.out << ok.err;
  auto id = first_line(ok.out);
  ASSERT_EQ(id.rfind("job-", 0), 0u) << ok.out;

  auto api = ctl.client();
  auto v = get_job(api, id);
  EXPECT_EQ(v.state, ctl_state::succeeded);
  EXPECT_EQ(v.status.name, "first");
  EXPECT_EQ(v.status.stage, "rl");
  EXPECT_EQ(v.status.iteration, 3);
  // The job is final before its driver process has exited.
  EXPECT_TRUE(test::eventually([&] { return !get_job(api, id).exit_reason.empty(); }, 30));
  EXPECT_EQ(get_job(api, id).exit_reason, "driver exited with status 0");
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path{v.run_dir} / "events.jsonl"));
  EXPECT_EQ(v.run_dir.rfind(ctl.state_dir() + "/jobs/" + id + "/", 0), 0u) << v.run_dir;

  // The whole stream of a finished job: contiguous from 1, then the end.
  int64_t expect = 1;
  int64_t syncs = 0, checkpoints = 0, version = 0;
  j::metric_map last;
  auto final = api.watch(id, 1, [&](const j::event& e) {
    EXPECT_EQ(e.seq, expect++);
    if (auto* m = std::get_if<j::metrics_reported>(&e.body))
      last = m->metrics;
    if (auto* w = std::get_if<j::weight_synced>(&e.body))
      ++syncs, version = w->version;
    checkpoints += std::holds_alternative<j::checkpoint_saved>(e.body) ? 1 : 0;
  });
  ASSERT_TRUE(final) << describe(final.error());
  EXPECT_EQ(final->state, ctl_state::succeeded);
  EXPECT_EQ(expect - 1, final->status.last_seq);
  // A finished job's status, read back from its journal: what the stream said.
  auto again = get_job(api, id);
  EXPECT_EQ(again.status.last_metrics, last);
  EXPECT_EQ(again.status.weight_versions.at("rollout"), version);
  EXPECT_EQ(again.totals.weight_syncs, syncs);
  EXPECT_EQ(again.totals.checkpoints, checkpoints);
  EXPECT_GT(checkpoints, 0);

  // Step 0 is the evaluation before the first iteration; from step 1 on.
  auto all = api.metrics(id, {}, "rl");
  ASSERT_TRUE(all);
  EXPECT_EQ(all->size(), 4u);
  auto points = api.metrics(id, {"actor/", "critic/score/mean"}, "rl", 1);
  ASSERT_TRUE(points) << describe(points.error());
  ASSERT_EQ(points->size(), 3u);
  for (size_t i = 0; i < points->size(); ++i) {
    EXPECT_EQ((*points)[i].step, static_cast<int64_t>(i + 1));
    EXPECT_TRUE((*points)[i].values.count("critic/score/mean"));
    EXPECT_TRUE((*points)[i].values.count("actor/pg_loss"));
    EXPECT_FALSE((*points)[i].values.count("critic/vf_loss")) << "only the keys asked for";
  }
  auto cli_metrics = ctl.cli({"metrics", id, "--key", "critic/score/mean", "--json"});
  EXPECT_EQ(cli_metrics.code, 0) << cli_metrics.err;
  EXPECT_NE(cli_metrics.out.find("\"critic/score/mean\""), std::string::npos);

  // A job that fails: --wait exits 1, status says which role and phase.
  auto bad = ctl.cli({"submit", spec, "--wait", "--set", "debug.fail_role=critic", "--set",
                      "debug.fail_phase=update_critic", "--set", "debug.fail_iteration=2"});
  EXPECT_EQ(bad.code, 1) << bad.out << bad.err;
  auto failed = get_job(api, first_line(bad.out));
  EXPECT_EQ(failed.state, ctl_state::failed);
  EXPECT_NE(failed.status.error.find("critic"), std::string::npos) << failed.status.error;
  auto status = ctl.cli({"status", first_line(bad.out)});
  EXPECT_EQ(status.code, 0);
  EXPECT_NE(status.out.find("failed"), std::string::npos) << status.out;

  // The last three log lines; the job's last one says the stage finished.
  auto logs = ctl.cli({"logs", id, "-n", "3"});
  EXPECT_EQ(logs.code, 0) << logs.err;
  EXPECT_EQ(std::count(logs.out.begin(), logs.out.end(), '\n'), 3) << logs.out;
  EXPECT_NE(logs.out.find("rl: finished, 3 steps"), std::string::npos) << logs.out;

  auto jobs = ctl.cli({"jobs"});
  EXPECT_EQ(jobs.code, 0);
  EXPECT_NE(jobs.out.find(id), std::string::npos);
  EXPECT_NE(jobs.out.find(first_line(bad.out)), std::string::npos);
  auto only_failed = ctl.cli({"jobs", "--state", "failed"});
  EXPECT_EQ(only_failed.out.find(id), std::string::npos);
  ctl.stop();
}

TEST(Control, PausesUpdatesResumesAndCancelsARunningJob) {
  test::temp_dir tmp;
  test::controller_process ctl{tmp.file("state")};
  ctl.start();
  auto id = test::submit(ctl, tmp.write("job.yaml", test::tiny_spec(test::endless)));
  ASSERT_FALSE(id.empty());
  auto api = ctl.client();
  ASSERT_TRUE(running_rl(api, id)) << "state " << to_string(get_job(api, id).state);

  // Illegal in this state: FAILED_PRECONDITION with the reason.
  auto again = ctl.cli({"resume", id});
  EXPECT_EQ(again.code, 2);
  EXPECT_NE(again.err.find("FAILED_PRECONDITION"), std::string::npos) << again.err;

  auto paused = ctl.cli({"pause", id});
  EXPECT_EQ(paused.code, 0) << paused.err;
  ASSERT_TRUE(reaches(api, id, ctl_state::paused, 60));

  auto set = ctl.cli({"set", id, "rl.kl.coef=0.05", "rl.generation.temperature=0.7"});
  EXPECT_EQ(set.code, 0) << set.err;
  auto refused = ctl.cli({"set", id, "rl.kl.coef=0.1", "rl.model.hidden_size=64"});
  EXPECT_EQ(refused.code, 2);
  EXPECT_NE(refused.err.find("rl.model.hidden_size"), std::string::npos) << refused.err;

  auto resumed = ctl.cli({"resume", id});
  EXPECT_EQ(resumed.code, 0) << resumed.err;
  ASSERT_TRUE(reaches(api, id, ctl_state::running, 60));

  // Both accepted settings arrive as events (at the next iteration: the
  // cancel waits for them); the refused pair changed nothing.
  std::mutex mu;
  std::vector<std::string> settings;
  auto watcher = std::async(std::launch::async, [&] {
    return api.watch(id, 1, [&](const j::event& e) {
      if (auto* s = std::get_if<j::setting_updated>(&e.body)) {
        std::lock_guard<std::mutex> lock{mu};
        settings.push_back(s->key + "=" + s->value);
      }
    });
  });
  ASSERT_TRUE(test::eventually(
      [&] {
        std::lock_guard<std::mutex> lock{mu};
        return settings.size() >= 2;
      },
      60));
  auto cancel = ctl.cli({"cancel", id});
  EXPECT_EQ(cancel.code, 0) << cancel.err;
  auto watched = ctl.cli({"watch", id});
  EXPECT_EQ(watched.code, 130) << watched.err;
  auto final = watcher.get();
  ASSERT_TRUE(final) << describe(final.error());
  EXPECT_EQ(final->state, ctl_state::cancelled);
  EXPECT_TRUE(final->resumable) << "cancel writes a checkpoint";
  EXPECT_EQ(settings, (std::vector<std::string>{"rl.kl.coef=0.05", "rl.generation.temperature=0.7"}));
  // A final job refuses commands.
  auto late = ctl.cli({"pause", id});
  EXPECT_EQ(late.code, 2);
  EXPECT_NE(late.err.find("cancelled"), std::string::npos) << late.err;
  ctl.stop();
}

TEST(Control, RefusesBadInputSayingWhatAndWhere) {
  test::temp_dir tmp;
  test::controller_process ctl{tmp.file("state")};
  ctl.start();
  auto api = ctl.client();

  auto malformed = tmp.write("broken.yaml", "rl:\n  iterations: [1, 2\n");
  auto r1 = ctl.cli({"submit", malformed});
  EXPECT_EQ(r1.code, 2);
  EXPECT_NE(r1.err.find("broken.yaml:"), std::string::npos) << r1.err;

  auto unknown_key = tmp.write("typo.yaml", "rl:\n  iterashuns: 3\n");
  submit_request req;
  req.spec_name = "typo.yaml";
  req.spec_text = test::text_of(unknown_key);
  auto r2 = api.submit(req);
  ASSERT_FALSE(r2);
  EXPECT_EQ(code_of(r2.error()), errc::invalid_config);
  EXPECT_NE(describe(r2.error()).find("typo.yaml:2:3"), std::string::npos) << describe(r2.error());
  EXPECT_NE(describe(r2.error()).find("rl.iterashuns"), std::string::npos);

  // Every violation comes back, each with its place.
  req.spec_text = "rl:\n  iterashuns: 3\ndata:\n  tsak: sort\n";
  auto r3 = api.submit(req);
  ASSERT_FALSE(r3);
  EXPECT_GE(violations_of(r3.error()).size(), 2u) << describe(r3.error());

  req.spec_text = std::string(2 << 20, '#');
  auto r4 = api.submit(req);
  ASSERT_FALSE(r4);
  EXPECT_EQ(code_of(r4.error()), errc::out_of_range);
  EXPECT_NE(describe(r4.error()).find("limit"), std::string::npos);

  for (const char* dir : {"../../etc", "/etc/troupe"}) {
    req.spec_text = test::tiny_spec(1) + "";
    req.overrides = {std::string{"run.dir="} + dir};
    auto r5 = api.submit(req);
    ASSERT_FALSE(r5) << dir;
    EXPECT_EQ(code_of(r5.error()), errc::invalid_config);
    EXPECT_NE(describe(r5.error()).find("outside the controller's jobs root"), std::string::npos)
        << describe(r5.error());
  }
  req.overrides = {};

  // A base file is read from what the client sent, never from the
  // controller's disk.
  req.spec_text = "base: /etc/passwd\n";
  auto r6 = api.submit(req);
  ASSERT_FALSE(r6);
  EXPECT_NE(describe(r6.error()).find("was not sent with the spec"), std::string::npos)
      << describe(r6.error());

  auto r7 = api.get("job-nope");
  ASSERT_FALSE(r7);
  EXPECT_EQ(code_of(r7.error()), errc::not_found);
  EXPECT_NE(describe(r7.error()).find("job-nope"), std::string::npos);
  auto r8 = ctl.cli({"cancel", "job-nope"});
  EXPECT_EQ(r8.code, 2);
  EXPECT_NE(r8.err.find("NOT_FOUND"), std::string::npos) << r8.err;

  auto listed = api.list();
  ASSERT_TRUE(listed);
  EXPECT_TRUE(listed->empty()) << "nothing refused was recorded";
  ctl.stop();
}

TEST(Control, EveryCallWithoutTheTokenIsRefusedAndChangesNothing) {
  test::temp_dir tmp;
  test::controller_process ctl{tmp.file("state")};
  ctl.start();
  auto good = ctl.client();
  submit_request req;
  req.spec_name = "job.yaml";
  req.spec_text = test::tiny_spec(1);
  auto queued = good.submit(req);
  ASSERT_TRUE(queued) << describe(queued.error());
  auto id = queued->status.id;
  ASSERT_TRUE(reaches(good, id, ctl_state::succeeded, 180));
  auto before = good.get(id);
  ASSERT_TRUE(before);

  for (std::string token : {std::string{"wrong-token-0123456789"}, std::string{"x"}}) {
    auto bad = ctl.client(token);
    std::vector<std::pair<std::string, caf::error>> calls{
        {"SubmitJob", bad.submit(req).error()},
        {"CancelJob", bad.cancel(id).error()},
        {"PauseJob", bad.pause(id).error()},
        {"ResumeJob", bad.resume(id).error()},
        {"CheckpointJob", bad.checkpoint(id).error()},
        {"UpdateJob", bad.update(id, {{"rl.kl.coef", "0.5"}}).error()},
        {"GetJob", bad.get(id).error()},
        {"ListJobs", bad.list().error()},
        {"GetMetrics", bad.metrics(id).error()},
        {"WatchJob", bad.watch(id, 1, [](const j::event&) {}).error()},
        {"TailLogs", bad.logs(id, 0, false, [](const log_entry&) {}).error()}};
    for (const auto& [name, err] : calls) {
      ASSERT_TRUE(err) << name << " answered without the token";
      EXPECT_NE(describe(err).find("UNAUTHENTICATED"), std::string::npos) << name << ": " << describe(err);
    }
  }
  auto after = good.list();
  ASSERT_TRUE(after);
  ASSERT_EQ(after->size(), 1u) << "no job was added";
  EXPECT_EQ(after->front().state, ctl_state::succeeded);
  EXPECT_EQ(after->front().status.last_seq, before->status.last_seq);
  ctl.stop();
  // Refused mutating calls are in the audit log, with who and the result.
  auto store = job_store::open(ctl.state_dir() + "/jobs.db");
  ASSERT_TRUE(store);
  auto audit = (*store)->audit_log(100);
  ASSERT_TRUE(audit);
  int refused = 0;
  for (const auto& a : *audit)
    refused += a.result.rfind("UNAUTHENTICATED", 0) == 0 ? 1 : 0;
  EXPECT_EQ(refused, 12) << "6 mutating calls x 2 tokens";
  EXPECT_EQ(audit->front().what, "SubmitJob");
  EXPECT_EQ(audit->front().result, "ok");
  EXPECT_NE(audit->front().who.find("127.0.0.1"), std::string::npos) << audit->front().who;
}

namespace {

// A unary call by method name with raw bytes (no generated stub needed).
grpc::Status raw_call(const std::shared_ptr<grpc::Channel>& ch, const std::string& method,
                      const std::string& request, std::string& response) {
  grpc::GenericStub stub{ch};
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice{request};
  grpc::ByteBuffer req{&slice, 1}, resp;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions{}, &req, &resp,
                 [&](grpc::Status s) { done.set_value(std::move(s)); });
  auto st = done.get_future().get();
  std::vector<grpc::Slice> slices;
  (void)resp.Dump(&slices);
  for (const auto& s : slices)
    response.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return st;
}

// One request on a bidirectional stream, every answer until the server ends.
class one_shot_bidi : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
public:
  explicit one_shot_bidi(std::string request) {
    grpc::Slice s{request};
    req_ = grpc::ByteBuffer{&s, 1};
  }
  void go() {
    StartWrite(&req_);
    StartRead(&resp_);
    StartCall();
  }
  void OnWriteDone(bool) override { StartWritesDone(); }
  void OnReadDone(bool ok) override {
    if (!ok)
      return;
    std::vector<grpc::Slice> slices;
    (void)resp_.Dump(&slices);
    for (const auto& s : slices)
      got_.append(reinterpret_cast<const char*>(s.begin()), s.size());
    StartRead(&resp_);
  }
  void OnDone(const grpc::Status& s) override { done_.set_value(s); }
  grpc::Status wait() { return done_.get_future().get(); }
  const std::string& got() const { return got_; }

private:
  grpc::ByteBuffer req_, resp_;
  std::string got_;
  std::promise<grpc::Status> done_;
};

} // namespace

TEST(Control, HealthAndReflectionAnswerAndNonLoopbackNeedsTls) {
  test::temp_dir tmp;
  test::controller_process ctl{tmp.file("state")};
  ctl.start();
  auto ch = grpc::CreateChannel(ctl.address(), grpc::InsecureChannelCredentials());
  // grpc.health.v1.Health/Check with no token: HealthCheckResponse{status: SERVING (1)}.
  std::string health;
  auto st = raw_call(ch, "/grpc.health.v1.Health/Check", "", health);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(health, std::string("\x08\x01", 2));
  // Reflection lists the services: ServerReflectionRequest{list_services: ""}.
  grpc::GenericStub stub{ch};
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  one_shot_bidi call{std::string("\x3a\x00", 2)};
  stub.PrepareBidiStreamingCall(&ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                grpc::StubOptions{}, &call);
  call.go();
  auto rs = call.wait();
  EXPECT_TRUE(rs.ok()) << rs.error_message();
  EXPECT_NE(call.got().find("troupe.v1.JobService"), std::string::npos);
  EXPECT_NE(call.got().find("grpc.health.v1.Health"), std::string::npos);
  ctl.stop();

  auto open = test::troupe_cli({"controller", "--listen", "0.0.0.0:0", "--state-dir", tmp.file("open")}, 60);
  EXPECT_EQ(open.code, 2);
  EXPECT_NE(open.err.find("TLS"), std::string::npos) << open.err;
  EXPECT_FALSE(std::filesystem::exists(tmp.file("open") + "/controller.json"));
}

TEST(Control, AKilledDriverFailsItsJobAndAKilledControllerComesBackWithEveryJob) {
  test::temp_dir tmp;
  test::controller_process ctl{tmp.file("state")};
  ctl.start({"--max-running-jobs", "3"});
  auto spec = tmp.write("job.yaml", test::tiny_spec(test::endless));
  auto short_spec = tmp.write("short.yaml", test::tiny_spec(2));
  auto api = ctl.client();
  auto submit = [&](const std::string& file) {
    auto r = ctl.cli({"submit", file});
    EXPECT_EQ(r.code, 0) << r.err;
    return first_line(r.out);
  };
  auto done = submit(short_spec);
  auto victim = submit(spec);
  ASSERT_TRUE(reaches(api, done, ctl_state::succeeded, 180));
  ASSERT_TRUE(running_rl(api, victim));

  // SIGKILL the driver: failed, with how it died, within 5 s.
  auto pid = get_job(api, victim).driver_pid;
  ASSERT_GT(pid, 0);
  ::kill(static_cast<pid_t>(pid), SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(reaches(api, victim, ctl_state::failed, 5));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  auto failed = get_job(api, victim);
  EXPECT_NE(failed.status.error.find("signal 9"), std::string::npos) << failed.status.error;
  EXPECT_TRUE(failed.resumable);

  // Two long jobs; the controller is SIGKILLed; one driver dies while it is down.
  auto survivor = submit(spec);
  auto orphan = submit(spec);
  ASSERT_TRUE(running_rl(api, survivor));
  ASSERT_TRUE(running_rl(api, orphan));
  auto orphan_pid = get_job(api, orphan).driver_pid;
  ctl.stop(SIGKILL);
  ::kill(static_cast<pid_t>(orphan_pid), SIGKILL);
  ASSERT_TRUE(test::eventually([&] { return ::kill(static_cast<pid_t>(orphan_pid), 0) != 0; }, 10));

  ctl.start({"--max-running-jobs", "3"});
  auto api2 = ctl.client();
  auto jobs = api2.list();
  ASSERT_TRUE(jobs) << describe(jobs.error());
  EXPECT_EQ(jobs->size(), 4u);
  EXPECT_EQ(get_job(api2, done).state, ctl_state::succeeded);
  EXPECT_EQ(get_job(api2, victim).state, ctl_state::failed);
  auto lost = get_job(api2, orphan);
  EXPECT_EQ(lost.state, ctl_state::lost);
  EXPECT_TRUE(lost.resumable);
  // The survivor's driver ran on: re-attached, it takes commands.
  ASSERT_TRUE(test::eventually(
      [&] {
        auto v = get_job(api2, survivor);
        return v.state == ctl_state::running && v.status.iteration >= 1;
      },
      60))
      << to_string(get_job(api2, survivor).state);
  auto cancelled = api2.cancel(survivor);
  ASSERT_TRUE(cancelled) << describe(cancelled.error());
  ASSERT_TRUE(reaches(api2, survivor, ctl_state::cancelled, 120));

  // The lost job resumes from its checkpoint and runs on.
  auto r = api2.resume(orphan);
  ASSERT_TRUE(r) << describe(r.error());
  ASSERT_TRUE(test::eventually(
      [&] {
        auto v = get_job(api2, orphan);
        return v.state == ctl_state::running && v.status.iteration >= 1;
      },
      180));
  ASSERT_TRUE(api2.cancel(orphan, true));
  ASSERT_TRUE(reaches(api2, orphan, ctl_state::cancelled, 120));
  ctl.stop();
}

TEST(Control, ThePythonExampleSubmitsWatchesAndReadsMetrics) {
  test::temp_dir tmp;
  test::controller_process ctl{tmp.file("state")};
  ctl.start();
  auto spec = tmp.write("job.yaml", test::tiny_spec(2));
  auto r = test::run_process({"/usr/bin/python3", std::string{TROUPE_SOURCE_DIR} + "/examples/python/submit_and_watch.py",
                              spec, "--set", "rl.iterations=3", "--address", ctl.address(), "--token-file",
                              ctl.state_dir() + "/token"},
                             300);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("submitted job-"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rl 3/3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("final JOB_STATE_SUCCEEDED, rl metric points 3"), std::string::npos) << r.out;
  ctl.stop();
}
