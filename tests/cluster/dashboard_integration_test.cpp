// The dashboard's HTTP face on a real `troupe controller` process
// (control_harness.hpp): login, sessions and CSRF in front of every call
// (NOTE [dashboard security]), the job's events as Server-Sent Events that
// go on from Last-Event-ID, the first load of a job page, and Prometheus'
// /metrics against the job's own metrics.
#include "cluster/job_store.hpp"
#include "tests/cluster/control_harness.hpp"
#include "tests/support/python_service.hpp"

#include <httplib.h>

#include <algorithm>
#include <map>
#include <regex>
#include <sstream>

using namespace troupe;
using namespace troupe::cluster;
namespace j = troupe::actors::job;
using json = nlohmann::json;

namespace {

httplib::Client web_client(const std::string& url) {
  httplib::Client c{url};
  c.set_connection_timeout(10, 0);
  c.set_read_timeout(60, 0);
  return c;
}

// A logged-in browser's cookie and CSRF token.
struct login {
  std::string cookie;
  std::string csrf;
  httplib::Headers headers() const { return {{"Cookie", cookie}}; }
  httplib::Headers post_headers() const { return {{"Cookie", cookie}, {"X-CSRF-Token", csrf}}; }
};

login log_in(httplib::Client& c, const std::string& token) {
  login out;
  auto r = c.Post("/login", httplib::Params{{"token", token}});
  EXPECT_TRUE(r);
  if (!r)
    return out;
  EXPECT_EQ(r->status, 303);
  EXPECT_EQ(r->get_header_value("Location"), "/");
  auto set = r->get_header_value("Set-Cookie");
  EXPECT_NE(set.find("HttpOnly"), std::string::npos) << set;
  EXPECT_NE(set.find("SameSite=Strict"), std::string::npos) << set;
  out.cookie = set.substr(0, set.find(';'));
  auto s = c.Get("/api/session", out.headers());
  EXPECT_TRUE(s && s->status == 200);
  if (s && s->status == 200)
    out.csrf = json::parse(s->body).at("csrf").get<std::string>();
  return out;
}

std::string state_of(httplib::Client& c, const login& l, const std::string& id) {
  auto r = c.Get("/api/jobs/" + id, l.headers());
  if (!r || r->status != 200)
    return "?";
  return json::parse(r->body).value("state", std::string{});
}

bool reaches(httplib::Client& c, const login& l, const std::string& id, const std::string& state) {
  return test::eventually([&] { return state_of(c, l, id) == state; }, 180);
}

std::vector<json> j_lines(const std::string& path) {
  std::vector<json> out;
  std::istringstream in(test::text_of(path));
  for (std::string line; std::getline(in, line);)
    out.push_back(json::parse(line));
  return out;
}

struct sse_event {
  int64_t id = 0;
  std::string event;
  std::string data;
};

// Reads the stream until `stop` says so (or it ends); events parsed.
std::vector<sse_event> read_sse(httplib::Client& c, const std::string& path, const httplib::Headers& h,
                                const std::function<bool(const sse_event&)>& stop) {
  std::vector<sse_event> out;
  std::string buf;
  sse_event cur;
  auto r = c.Get(path.c_str(), h, [&](const char* data, size_t n) {
    buf.append(data, n);
    size_t nl;
    while ((nl = buf.find('\n')) != std::string::npos) {
      auto line = buf.substr(0, nl);
      buf.erase(0, nl + 1);
      if (line.empty()) {
        if (!cur.event.empty()) {
          out.push_back(cur);
          if (stop(cur))
            return false;
        }
        cur = {};
      } else if (line.rfind("id: ", 0) == 0) {
        cur.id = std::stoll(line.substr(4));
      } else if (line.rfind("event: ", 0) == 0) {
        cur.event = line.substr(7);
      } else if (line.rfind("data: ", 0) == 0) {
        cur.data += line.substr(6);
      }
    }
    return true;
  });
  (void)r;
  return out;
}

// Prometheus' text format: HELP / TYPE comments and `name{labels} value`
// samples; fails the test on any other line. Samples by "name{labels}".
std::map<std::string, double> parse_exposition(const std::string& text) {
  static const std::regex sample{
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? (NaN|[+-]Inf|[-+0-9.eE]+)$)"};
  static const std::regex comment{R"(^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$)"};
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  std::map<std::string, std::string> types;
  while (std::getline(in, line)) {
    std::smatch m;
    if (std::regex_match(line, m, comment)) {
      if (m[1] == "TYPE") {
        auto rest = line.substr(7);
        auto name = rest.substr(0, rest.find(' '));
        auto type = rest.substr(rest.find(' ') + 1);
        EXPECT_TRUE(type == "gauge" || type == "counter") << line;
        EXPECT_EQ(types.count(name), 0u) << "TYPE twice: " << line;
        types[name] = type;
        if (type == "counter")
          EXPECT_NE(name.find("_total"), std::string::npos) << "a counter without _total: " << name;
      }
      continue;
    }
    if (!std::regex_match(line, m, sample)) {
      ADD_FAILURE() << "not the exposition format: " << line;
      continue;
    }
    EXPECT_TRUE(types.count(m[1])) << "a sample before its TYPE: " << line;
    EXPECT_EQ(m[1].str().rfind("troupe_", 0), 0u) << line;
    auto v = m[5].str();
    out[line.substr(0, line.rfind(' '))] = v == "NaN" ? NAN : v == "+Inf" ? INFINITY : v == "-Inf" ? -INFINITY : std::stod(v);
  }
  return out;
}

} // namespace

TEST(Dashboard, EveryCallNeedsASessionAndEveryChangeItsCsrfToken) {
  test::temp_dir tmp;
  test::controller_process ctl{tmp.file("state")};
  ctl.start();
  ASSERT_EQ(ctl.dashboard().rfind("http://127.0.0.1:", 0), 0u) << ctl.dashboard();
  auto id = test::submit(ctl, tmp.write("job.yaml", test::tiny_spec(test::endless)));
  ASSERT_FALSE(id.empty());
  auto c = web_client(ctl.dashboard());

  // Without a session: nothing but the login page and the static files.
  for (const auto& path : {std::string{"/api/jobs"}, std::string{"/api/session"}, "/api/jobs/" + id}) {
    auto r = c.Get(path.c_str());
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 401) << path;
    EXPECT_EQ(r->body.find("\"state\""), std::string::npos) << path;
  }
  for (const auto& path : {"/api/jobs/" + id + "/snapshot", "/api/jobs/" + id + "/events",
                           "/api/jobs/" + id + "/processes", std::string{"/metrics"}}) {
    auto r = c.Get(path.c_str());
    ASSERT_TRUE(r) << path;
    EXPECT_EQ(r->status, 401) << path;
    EXPECT_EQ(r->body.find("\"seq\""), std::string::npos) << path;
  }
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 303);
  EXPECT_EQ(page->get_header_value("Location"), "/login");
  auto asset = c.Get("/assets/app.js");
  ASSERT_TRUE(asset);
  EXPECT_EQ(asset->status, 200);
  EXPECT_NE(asset->get_header_value("Content-Security-Policy").find("script-src 'self'"), std::string::npos);
  EXPECT_EQ(c.Get("/assets/../token")->status, 404);
  auto wrong = c.Post("/login", httplib::Params{{"token", std::string(64, 'a')}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  EXPECT_FALSE(wrong->has_header("Set-Cookie"));
  auto bad_cookie = c.Get("/api/jobs", {{"Cookie", "troupe_session=" + std::string(64, 'f')}});
  EXPECT_EQ(bad_cookie->status, 401);

  auto l = log_in(c, ctl.token());
  ASSERT_FALSE(l.csrf.empty());
  auto jobs = c.Get("/api/jobs", l.headers());
  ASSERT_EQ(jobs->status, 200);
  EXPECT_EQ(json::parse(jobs->body)["jobs"][0]["id"], id);
  ASSERT_TRUE(reaches(c, l, id, "JOB_STATE_RUNNING"));

  // Refused changes: no session, no CSRF token, a wrong one, another origin.
  const std::string pause = "/api/jobs/" + id + "/pause";
  EXPECT_EQ(c.Post(pause.c_str())->status, 401);
  EXPECT_EQ(c.Post(pause.c_str(), l.headers(), "", "text/plain")->status, 403);
  EXPECT_EQ(c.Post(pause.c_str(), {{"Cookie", l.cookie}, {"X-CSRF-Token", std::string(64, '0')}}, "",
                   "text/plain")
                ->status,
            403);
  auto cross = l.post_headers();
  cross.emplace("Origin", "http://evil.example");
  EXPECT_EQ(c.Post(pause.c_str(), cross, "", "text/plain")->status, 403);
  EXPECT_EQ(state_of(c, l, id), "JOB_STATE_RUNNING");
  // (That none of them reached the job is read from its journal below.)

  // Accepted: pause, resume, cancel, each answered with the job.
  auto same = l.post_headers();
  same.emplace("Origin", ctl.dashboard());
  auto p = c.Post(pause.c_str(), same, "", "text/plain");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, 200) << p->body;
  ASSERT_TRUE(reaches(c, l, id, "JOB_STATE_PAUSED"));
  EXPECT_EQ(c.Post(("/api/jobs/" + id + "/resume").c_str(), l.post_headers(), "", "text/plain")->status, 200);
  ASSERT_TRUE(reaches(c, l, id, "JOB_STATE_RUNNING"));
  auto illegal = c.Post(("/api/jobs/" + id + "/resume").c_str(), l.post_headers(), "", "text/plain");
  EXPECT_EQ(illegal->status, 400) << illegal->body;
  EXPECT_NE(json::parse(illegal->body).value("error", "").find("running"), std::string::npos) << illegal->body;
  EXPECT_EQ(c.Post("/api/jobs/job-nope/pause", l.post_headers(), "", "text/plain")->status, 404);

  // Logging out ends the session.
  auto out = c.Post("/logout", l.headers(), "csrf=" + l.csrf, "application/x-www-form-urlencoded");
  ASSERT_TRUE(out);
  EXPECT_EQ(out->status, 303);
  EXPECT_EQ(c.Get("/api/jobs", l.headers())->status, 401);
  EXPECT_EQ(ctl.cli({"cancel", id, "--now"}).code, 0);
  auto client = ctl.client();
  ASSERT_TRUE(test::eventually([&] { return client.get(id)->state == ctl_state::cancelled; }, 120));
  auto run_dir = client.get(id)->run_dir;
  ctl.stop();

  // The journal: the refused requests changed nothing; the one accepted
  // pause is the job's only pause, and it was resumed and then cancelled.
  std::vector<std::string> states;
  for (const auto& line : j_lines(run_dir + "/events.jsonl"))
    if (line["kind"] == "state")
      states.push_back(line["to"].get<std::string>());
  EXPECT_EQ(std::count(states.begin(), states.end(), "paused"), 1) << json(states).dump();
  ASSERT_GE(states.size(), 3u);
  EXPECT_EQ(std::vector<std::string>(states.end() - 3, states.end()),
            (std::vector<std::string>{"paused", "running", "cancelled"}))
    << json(states).dump();

  auto store = job_store::open(ctl.state_dir() + "/jobs.db");
  ASSERT_TRUE(store);
  auto audit = (*store)->audit_log(100);
  ASSERT_TRUE(audit);
  std::map<std::string, int> seen;
  for (const auto& a : *audit)
    if (a.what.rfind("dashboard", 0) == 0)
      ++seen[a.what + " " + (a.result == "ok" ? "ok" : a.result.substr(0, a.result.find(':')))];
  EXPECT_EQ(seen["dashboard login UNAUTHENTICATED"], 1);
  EXPECT_EQ(seen["dashboard login ok"], 1);
  EXPECT_EQ(seen["dashboard pause UNAUTHENTICATED"], 1);
  EXPECT_EQ(seen["dashboard pause PERMISSION_DENIED"], 3);
  EXPECT_EQ(seen["dashboard pause NOT_FOUND"], 1);
  EXPECT_EQ(seen["dashboard pause ok"], 1);
  EXPECT_EQ(seen["dashboard resume ok"], 1);
  EXPECT_EQ(seen["dashboard resume FAILED_PRECONDITION"], 1);

  auto open = test::troupe_cli({"controller", "--listen", "127.0.0.1:0", "--dashboard", "0.0.0.0:0",
                                "--state-dir", tmp.file("open")},
                               60);
  EXPECT_EQ(open.code, 2);
  EXPECT_NE(open.err.find("TLS"), std::string::npos) << open.err;
}

TEST(Dashboard, EventsStreamOnFromLastEventIdAndMetricsMatchTheJob) {
  test::temp_dir tmp;
  test::controller_process ctl{tmp.file("state")};
  ctl.start();
  auto id = test::submit(ctl, tmp.write("job.yaml", test::tiny_spec(test::endless)));
  ASSERT_FALSE(id.empty());
  auto c = web_client(ctl.dashboard());
  auto l = log_in(c, ctl.token());
  auto api = ctl.client();
  ASSERT_TRUE(test::reaches_rl_iteration(api, id, 2));

  // The first 30 events, then a reconnect after #20: it goes on at #21.
  const std::string path = "/api/jobs/" + id + "/events";
  auto first = read_sse(c, path + "?from=1", l.headers(), [](const sse_event& e) { return e.id >= 30; });
  ASSERT_GE(first.size(), 30u);
  for (size_t i = 0; i < 30; ++i) {
    EXPECT_EQ(first[i].id, static_cast<int64_t>(i + 1));
    EXPECT_EQ(first[i].event, "event");
    EXPECT_EQ(json::parse(first[i].data)["seq"], first[i].id);
  }
  auto h = l.headers();
  h.emplace("Last-Event-ID", "20");
  auto again = read_sse(c, path, h, [](const sse_event& e) { return e.id >= 25; });
  ASSERT_FALSE(again.empty());
  EXPECT_EQ(again.front().id, 21);
  EXPECT_EQ(c.Get((path + "?from=abc").c_str(), l.headers())->status, 400);

  // Paused, the job holds still: /metrics against its own numbers.
  ASSERT_TRUE(api.pause(id));
  ASSERT_TRUE(test::eventually([&] { return api.get(id)->state == ctl_state::paused; }, 120));
  auto v = *api.get(id);
  auto unauth = c.Get("/metrics", {{"Authorization", "Bearer " + std::string(64, 'x')}});
  EXPECT_EQ(unauth->status, 401);
  auto r = c.Get("/metrics", {{"Authorization", "Bearer " + ctl.token()}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  EXPECT_EQ(r->get_header_value("Content-Type").rfind("text/plain; version=0.0.4", 0), 0u);
  auto m = parse_exposition(r->body);
  const std::string job = "{job_id=\"" + id + "\"}";
  EXPECT_EQ(m["troupe_jobs{state=\"paused\"}"], 1);
  EXPECT_EQ(m["troupe_jobs{state=\"running\"}"], 0);
  EXPECT_EQ(m["troupe_job_step" + job], v.status.iteration);
  EXPECT_EQ(m["troupe_job_steps" + job], v.status.total);
  const auto& last = v.status.last_metrics;
  EXPECT_EQ(m["troupe_job_score" + job], last.count("val/score/mean") ? last.at("val/score/mean")
                                                                       : last.at("critic/score/mean"));
  EXPECT_EQ(m["troupe_job_kl" + job], last.at("actor/ppo_kl"));
  EXPECT_EQ(m["troupe_job_throughput_tokens_per_second" + job], last.at("perf/throughput"));
  EXPECT_EQ(m["troupe_job_rollout_kv_utilization_ratio" + job], last.at("rollout/kv_utilization"));
  int phases = 0;
  for (const auto& [k, x] : last)
    if (k.rfind("timing_s/", 0) == 0) {
      ++phases;
      EXPECT_EQ(m["troupe_job_phase_seconds{job_id=\"" + id + "\",phase=\"" + k.substr(9) + "\"}"], x) << k;
    }
  EXPECT_GT(phases, 5);
  // The counters against the journal's own events up to the pause.
  int64_t syncs = 0, checkpoints = 0;
  for (const auto& line : j_lines(v.run_dir + "/events.jsonl")) {
    syncs += line["kind"] == "weight_sync" ? 1 : 0;
    checkpoints += line["kind"] == "checkpoint" ? 1 : 0;
  }
  EXPECT_EQ(m["troupe_job_weight_syncs_total" + job], syncs);
  EXPECT_EQ(m["troupe_job_checkpoints_total" + job], checkpoints);
  EXPECT_GT(checkpoints, 0);
  EXPECT_GT(m["troupe_job_weight_sync_bytes_total" + job], 0);
  EXPECT_GT(m["troupe_process_resident_memory_bytes{job_id=\"" + id + "\",process=\"driver\"}"], 1e6);

  // A job page's first load: thinned series, recent events, where to go on.
  auto snap = c.Get(("/api/jobs/" + id + "/snapshot?points=8").c_str(), l.headers());
  ASSERT_EQ(snap->status, 200);
  auto s = json::parse(snap->body);
  EXPECT_EQ(s["job"]["id"], id);
  EXPECT_EQ(s["last_seq"].get<int64_t>(), v.status.last_seq);
  ASSERT_TRUE(s["series"].contains("rl"));
  for (const auto& [key, series] : s["series"]["rl"].items())
    EXPECT_LE(series["step"].size(), 8u) << key;
  EXPECT_FALSE(s["events"].empty());
  auto full = c.Get(("/api/jobs/" + id + "/snapshot?points=100000").c_str(), l.headers());
  auto all = json::parse(full->body)["series"]["rl"]["actor/ppo_kl"];
  auto points = api.metrics(id, {"actor/ppo_kl"}, "rl");
  ASSERT_TRUE(points);
  ASSERT_EQ(all["step"].size(), points->size());
  for (size_t i = 0; i < points->size(); ++i) {
    EXPECT_EQ(all["step"][i], (*points)[i].step);
    EXPECT_EQ(all["value"][i].get<double>(), (*points)[i].values.at("actor/ppo_kl"));
  }
  auto procs = json::parse(c.Get(("/api/jobs/" + id + "/processes").c_str(), l.headers())->body);
  ASSERT_FALSE(procs["processes"].empty());
  EXPECT_EQ(procs["processes"][0]["process"], "driver");
  EXPECT_EQ(procs["processes"][0]["pid"], v.driver_pid);
  EXPECT_TRUE(procs["processes"][0]["alive"].get<bool>());
  EXPECT_EQ(ctl.cli({"cancel", id, "--now"}).code, 0);
  ctl.stop();
}

// The job runs two-turn episodes against the Python environment server
// (--echo: every turn answered with an observation, none ending it), so the
// page's evaluation samples are conversations with their turns marked.
TEST(Dashboard, InARealBrowserTheChartsGrowAndThePageControlsTheJob) {
  test::temp_dir tmp;
  if (auto why = test::python_grpc_missing(); !why.empty())
    GTEST_SKIP() << why;
  test::python_service env{tmp, "tool_env_server.py", {"--echo"}};
  std::string why;
  auto env_address = env.address(why);
  ASSERT_FALSE(env_address.empty()) << why;
  // SFT long enough that the policy ends its answers (EOS), so its first
  // turns end and a second follows; a context with room for it.
  auto spec = test::tiny_spec(test::endless);
  auto set = [&](const std::string& from, const std::string& to) {
    ASSERT_NE(spec.find(from), std::string::npos) << from;
    spec.replace(spec.find(from), from.size(), to);
  };
  set("max_position_embeddings: 24", "max_position_embeddings: 64");
  set("sft: {steps: 4,", "sft: {steps: 60,");
  set("generation: {max_tokens: 5}", "generation: {max_tokens: 8}");
  set("rollout: {num_blocks: 64, block_size: 4}",
      "rollout: {num_blocks: 64, block_size: 4},\n     environment: {kind: remote, max_turns: 2, "
      "remote: {address: '" +
          env_address + "'}}");
  test::controller_process ctl{tmp.file("state")};
  ctl.start();
  auto id = test::submit(ctl, tmp.write("job.yaml", spec), {"--name", "browser-test"});
  ASSERT_FALSE(id.empty());
  auto api = ctl.client();
  ASSERT_TRUE(test::reaches_rl_iteration(api, id, 1));
  auto artifacts = std::string{TROUPE_ARTIFACTS_DIR} + "/dashboard";
  std::filesystem::remove_all(artifacts);
  auto r = test::run_process(
      {"/usr/bin/python3", std::string{TROUPE_SOURCE_DIR} + "/tests/cluster/dashboard_browser.py",
       "--url", ctl.dashboard(), "--token-file", ctl.state_dir() + "/token", "--job", id,
       "--artifacts", artifacts, "--expect-turns", "2"},
      300);
  EXPECT_EQ(r.code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("browser: ok"), std::string::npos) << r.out << r.err;
  for (const char* shot : {"jobs.png", "job.png", "paused.png"})
    EXPECT_GT(std::filesystem::exists(artifacts + "/" + shot) ? std::filesystem::file_size(artifacts + "/" + shot) : 0,
              10000u)
        << shot;
  // The page's pause and resume reached the job (and the audit log).
  auto v = api.get(id);
  ASSERT_TRUE(v);
  bool paused = false;
  for (const auto& t : v->transitions)
    paused = paused || t.state == ctl_state::paused;
  EXPECT_TRUE(paused);
  EXPECT_EQ(ctl.cli({"cancel", id, "--now"}).code, 0);
  ctl.stop();
}
