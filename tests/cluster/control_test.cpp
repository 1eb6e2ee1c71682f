// The control plane's pieces on their own: the one mapping from troupe's
// error codes to gRPC status codes (every code round-trips), the job store
// in a real SQLite file (WAL mode, records survive a reopen), and the job
// API's messages (every event kind and the job view round-trip through
// protobuf).
#include "cluster/api_server.hpp"
#include "cluster/controller_config.hpp"
#include "cluster/grpc_status.hpp"
#include "cluster/job_proto.hpp"
#include "cluster/job_store.hpp"
#include "tests/support/temp_dir.hpp"

#include <gtest/gtest.h>

#include <sqlite3.h>
#include <sys/stat.h>

#include <set>

using namespace troupe;
using namespace troupe::cluster;
namespace j = troupe::actors::job;

TEST(GrpcStatus, EveryTroupeCodeHasAStatusAndRoundTrips) {
  std::set<grpc::StatusCode> used;
  for (uint8_t i = 1; i < errc_count; ++i) {
    auto code = static_cast<errc>(i);
    auto st = to_grpc_status(make_error(code, "what went wrong"));
    EXPECT_FALSE(st.ok()) << to_string(code);
    EXPECT_NE(st.error_code(), grpc::StatusCode::UNKNOWN) << to_string(code);
    EXPECT_EQ(st.error_code(), grpc_code_of(code));
    EXPECT_EQ(st.error_message(), "what went wrong");
    auto back = detail_of(st);
    EXPECT_EQ(back.code, code) << to_string(code) << " came back as " << to_string(back.code);
    used.insert(st.error_code());
  }
  EXPECT_TRUE(to_grpc_status(caf::error{}).ok());
  EXPECT_EQ(grpc_code_of(errc::none), grpc::StatusCode::OK);
  EXPECT_EQ(grpc_code_of(errc::illegal_state), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(grpc_code_of(errc::not_found), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(grpc_code_of(errc::invalid_config), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_GE(used.size(), 10u);
}

TEST(GrpcStatus, ViolationsTravelOneByOne) {
  auto err = make_error_list(errc::invalid_config, {"job.yaml:3:5: rl.kl.coef: must be >= 0",
                                                    "job.yaml:9:1: data.tsak: unknown key; did you mean task"});
  auto back = detail_of(to_grpc_status(err));
  EXPECT_EQ(back.code, errc::invalid_config);
  ASSERT_EQ(back.violations.size(), 2u);
  EXPECT_EQ(back.violations[1], "job.yaml:9:1: data.tsak: unknown key; did you mean task");
  // A prefix keeps them.
  EXPECT_EQ(violations_of(with_prefix(err, "spec")).size(), 2u);
}

TEST(GrpcStatus, AStatusWithoutDetailsMapsToTheClosestCode) {
  auto d = detail_of(grpc::Status{grpc::StatusCode::DEADLINE_EXCEEDED, "slow"});
  EXPECT_EQ(d.code, errc::timeout);
  EXPECT_EQ(d.message, "slow");
}

TEST(JobStore, RecordsTransitionsAndAuditSurviveAReopenInWalMode) {
  test::temp_dir tmp;
  auto path = tmp.file("jobs.db");
  {
    auto store = job_store::open(path);
    ASSERT_TRUE(store) << describe(store.error());
    job_record r;
    r.id = "job-1";
    r.name = "quick";
    r.state = "queued";
    r.spec_name = "job.yaml";
    r.spec_text = "rl: {iterations: 2}\n";
    r.resolved_config = "run: {}\n";
    r.job_dir = tmp.file("jobs/job-1");
    r.run_dir = tmp.file("jobs/job-1/run");
    r.submit_time_us = 17;
    r.cores = 2;
    ASSERT_TRUE((*store)->insert(r));
    EXPECT_FALSE((*store)->insert(r)) << "an id is inserted once";
    ASSERT_TRUE((*store)->add_transition("job-1", {"pending", 20, "admitted"}));
    r.state = "failed";
    r.error = "role critic failed";
    r.resumable = true;
    r.stage = "rl";
    r.iteration = 3;
    ASSERT_TRUE((*store)->update(r));
    ASSERT_TRUE((*store)->audit({30, "ipv4:127.0.0.1:5 user=a", "CancelJob", "job-1", "ok"}));
  }
  auto store = job_store::open(path);
  ASSERT_TRUE(store);
  auto jobs = (*store)->jobs();
  ASSERT_TRUE(jobs);
  ASSERT_EQ(jobs->size(), 1u);
  const auto& r = jobs->front();
  EXPECT_EQ(r.state, "failed");
  EXPECT_EQ(r.error, "role critic failed");
  EXPECT_TRUE(r.resumable);
  EXPECT_EQ(r.iteration, 3);
  EXPECT_EQ(r.cores, 2);
  EXPECT_EQ(r.spec_text, "rl: {iterations: 2}\n");
  auto ts = (*store)->transitions("job-1");
  ASSERT_TRUE(ts);
  ASSERT_EQ(ts->size(), 1u);
  EXPECT_EQ((*ts)[0].reason, "admitted");
  auto audit = (*store)->audit_log(10);
  ASSERT_TRUE(audit);
  ASSERT_EQ(audit->size(), 1u);
  EXPECT_EQ((*audit)[0].what, "CancelJob");
  auto none = (*store)->find("job-2");
  ASSERT_TRUE(none);
  EXPECT_FALSE(*none);
  // WAL mode is the database's own setting: another connection sees it.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "PRAGMA journal_mode", -1, &st, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(st, 0)), "wal");
  sqlite3_finalize(st);
  sqlite3_close(db);
}

namespace {

std::vector<j::event_body> one_of_each_kind() {
  j::eval_samples samples{
      "rl", 4, {{"123", "321", 0.5}, {"9", "9", 1, R"([{"role":"tool","content":"9","turn":1}])"}}};
  return {j::state_changed{j::job_state::running, j::job_state::paused, "asked"},
          j::stage_started{"rl", 10, 2},
          j::stage_finished{"rl", 10, 3.5, true},
          j::phase_started{"rl", 3, "generate"},
          j::phase_finished{"rl", 3, "generate", 0.25, false},
          j::metrics_reported{"rl", 3, 10, {{"actor/pg_loss", -0.5}, {"critic/score/mean", 0.75}}},
          j::weight_synced{"rl", 4, "alias", 1234, 0.01, "policy", "rollout", 2345, 1234},
          j::checkpoint_saved{"rl", 4, "/tmp/x", 99, 0.2},
          j::role_changed{"rl", "critic", 1, "worker 2", 4242, "failed", "died", 9, "update_critic"},
          samples,
          j::log_line{"warn", "careful"},
          j::setting_updated{"rl.kl.coef", "0.05", "0.001", 7}};
}

} // namespace

TEST(JobProto, EveryEventKindRoundTripsFieldForField) {
  auto bodies = one_of_each_kind();
  ASSERT_EQ(bodies.size(), std::variant_size_v<j::event_body>) << "one of each kind";
  // The oneof's fields are exactly the event kinds.
  const auto* oneof = v1::Event::descriptor()->FindOneofByName("body");
  ASSERT_NE(oneof, nullptr);
  ASSERT_EQ(static_cast<size_t>(oneof->field_count()), j::event_kinds().size());
  for (int i = 0; i < oneof->field_count(); ++i)
    EXPECT_EQ(oneof->field(i)->name(), std::string{j::event_kinds()[static_cast<size_t>(i)]});
  int64_t seq = 1;
  for (const auto& b : bodies) {
    j::event e{seq++, 1000 + seq, b};
    v1::Event msg;
    to_proto(e, &msg);
    auto back = from_proto(msg);
    ASSERT_TRUE(back) << describe(back.error());
    // The JSON form covers every field: equal JSON, equal events.
    EXPECT_EQ(j::to_json(*back), j::to_json(e));
  }
  v1::Event empty;
  EXPECT_FALSE(from_proto(empty));
}

TEST(JobProto, StatesKeepTheirNamesAndAJobViewRoundTrips) {
  for (int i = 0; i < ctl_state_count; ++i) {
    auto s = static_cast<ctl_state>(i);
    auto name = v1::JobState_Name(to_proto(s));
    std::string upper;
    for (char c : to_string(s))
      upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_EQ(name, "JOB_STATE_" + upper);
    auto back = from_proto(to_proto(s));
    ASSERT_TRUE(back);
    EXPECT_EQ(*back, s);
  }
  EXPECT_FALSE(from_proto(v1::JOB_STATE_UNSPECIFIED));
  job_view v;
  v.state = ctl_state::paused;
  v.status.id = "job-9";
  v.status.stage = "rl";
  v.status.iteration = 3;
  v.status.total = 9;
  v.status.last_metrics = {{"a", 1.5}};
  v.status.weight_versions = {{"rollout", 3}};
  v.resumable = true;
  v.transitions = {{ctl_state::queued, 5, "submitted"}, {ctl_state::paused, 9, "asked"}};
  v.roles = {{"rl", "policy", 0, "driver", 77, "ready", "", 0, ""}};
  v1::Job msg;
  to_proto(v, &msg);
  auto back = from_proto(msg);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->state, ctl_state::paused);
  EXPECT_EQ(back->status.id, "job-9");
  EXPECT_EQ(back->status.last_metrics.at("a"), 1.5);
  EXPECT_EQ(back->transitions.size(), 2u);
  EXPECT_EQ(back->roles.at(0).pid, 77);
  EXPECT_TRUE(back->resumable);
}

TEST(ApiSecurity, AddressesTokensAndTheirFiles) {
  EXPECT_TRUE(is_loopback_host("127.0.0.1"));
  EXPECT_TRUE(is_loopback_host("127.3.2.1"));
  EXPECT_TRUE(is_loopback_host("::1"));
  EXPECT_TRUE(is_loopback_host("localhost"));
  EXPECT_FALSE(is_loopback_host("0.0.0.0"));
  EXPECT_FALSE(is_loopback_host("10.0.0.1"));
  EXPECT_FALSE(is_loopback_host("example.org"));
  auto a = parse_listen_address("[::1]:80");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->first, "::1");
  EXPECT_EQ(a->second, 80);
  EXPECT_FALSE(parse_listen_address("127.0.0.1"));
  EXPECT_FALSE(parse_listen_address("127.0.0.1:99999"));
  EXPECT_FALSE(parse_listen_address("127.0.0.1:8x"));

  test::temp_dir tmp;
  auto path = tmp.file("token");
  auto t1 = load_or_create_token(path);
  ASSERT_TRUE(t1) << describe(t1.error());
  EXPECT_EQ(t1->size(), 64u);
  struct stat st{};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto t2 = load_or_create_token(path);
  ASSERT_TRUE(t2);
  EXPECT_EQ(*t1, *t2) << "the token survives a restart";
  ::chmod(path.c_str(), 0644);
  auto t3 = load_or_create_token(path);
  ASSERT_FALSE(t3);
  EXPECT_NE(describe(t3.error()).find("readable by others"), std::string::npos);
}

TEST(ControllerConfig, TheExamplesLoadAndBadValuesAreRefusedWithTheirPlace) {
  auto dir = std::string{TROUPE_SOURCE_DIR} + "/configs/control/";
  auto c = runtime::load_config_file<controller_file>(dir + "controller.yaml");
  ASSERT_TRUE(c) << describe(c.error());
  EXPECT_EQ(c->listen, "127.0.0.1:7450");
  EXPECT_EQ(c->controller.on_shutdown, cluster::shutdown_policy::checkpoint);
  EXPECT_EQ(c->controller.max_running_jobs, 2);
  EXPECT_EQ(c->dashboard.listen, "127.0.0.1:7451");
  EXPECT_EQ(c->dashboard.max_points, 2000);
  auto client = runtime::load_config_file<client_file>(dir + "client.yaml");
  ASSERT_TRUE(client) << describe(client.error());
  EXPECT_EQ(client->address, "controller.example.org:7450");

  test::temp_dir tmp;
  auto bad = tmp.write("c.yaml", "max_running_jobs: 0\non_shutdown: later\ntls: {cert: a.pem}\n");
  auto r = runtime::load_config_file<controller_file>(bad);
  ASSERT_FALSE(r);
  EXPECT_NE(describe(r.error()).find("c.yaml:2:14: on_shutdown"), std::string::npos) << describe(r.error());
  auto web = tmp.write("d.yaml", "dashboard:\n  listen: nowhere\n  max_streams: 0\n");
  auto d = runtime::load_config_file<controller_file>(web);
  ASSERT_FALSE(d);
  for (const char* part : {"dashboard.listen", "dashboard.max_streams", "[1, 1024]"})
    EXPECT_NE(describe(d.error()).find(part), std::string::npos) << describe(d.error());
}
