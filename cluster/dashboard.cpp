#include "cluster/dashboard.hpp"

#include "actors/job/metrics_sink.hpp"
#include "cluster/grpc_status.hpp"
#include "cluster/job_proto.hpp"
#include "cluster/job_store.hpp"
#include "cluster/prometheus.hpp"
#include "cluster/web_assets.hpp"
#include "runtime/file_io.hpp"

#include <google/protobuf/util/json_util.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

namespace troupe::cluster {

namespace j = actors::job;
using json = nlohmann::json;

namespace {

constexpr const char* kCookie = "troupe_session";

// ---- JSON of the API's messages ----

// A job as the API's JSON (protobuf's JSON mapping of troupe.v1.Job, field
// names as in the .proto): one description of a job for both faces.
json job_json(const job_view& v, bool with_config) {
  v1::Job msg;
  to_proto(v, &msg);
  if (!with_config)
    msg.clear_resolved_config();
  google::protobuf::util::JsonPrintOptions o;
  o.preserve_proto_field_names = true;
  o.always_print_primitive_fields = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(msg, &out, o);
  return json::parse(out, nullptr, false);
}

json event_json(const j::event& e) {
  return json::parse(j::to_json(e), nullptr, false);
}

void reply_json(httplib::Response& res, const json& body, int status = 200) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void reply_error(httplib::Response& res, const caf::error& err) {
  reply_json(res, {{"error", describe(err)}}, http_status_of(grpc_code_of(code_of(err))));
}

void reply_status(httplib::Response& res, int status, const std::string& message) {
  reply_json(res, {{"error", message}}, status);
}

// ---- series for charts ----

// Keeps at most `max` points of a series: each bucket of steps keeps its
// lowest and highest value, so spikes survive the thinning.
struct series {
  std::vector<int64_t> step;
  std::vector<double> value;
};

series thin(const series& s, size_t max) {
  if (s.step.size() <= max || max < 4)
    return s;
  series out;
  size_t buckets = max / 2;
  double width = static_cast<double>(s.step.size()) / static_cast<double>(buckets);
  for (size_t b = 0; b < buckets; ++b) {
    auto lo = static_cast<size_t>(std::floor(b * width));
    auto hi = std::min(s.step.size(), static_cast<size_t>(std::floor((b + 1) * width)));
    if (lo >= hi)
      continue;
    size_t mn = lo, mx = lo;
    for (size_t i = lo; i < hi; ++i) {
      if (!std::isfinite(s.value[i]))
        continue;
      if (!std::isfinite(s.value[mn]) || s.value[i] < s.value[mn])
        mn = i;
      if (!std::isfinite(s.value[mx]) || s.value[i] > s.value[mx])
        mx = i;
    }
    for (size_t i : {std::min(mn, mx), std::max(mn, mx)}) {
      if (!out.step.empty() && out.step.back() == s.step[i])
        continue;
      out.step.push_back(s.step[i]);
      out.value.push_back(s.value[i]);
    }
  }
  return out;
}

json series_json(const series& s) {
  json values = json::array();
  for (double v : s.value)
    values.push_back(std::isfinite(v) ? json(v) : json(nullptr));
  return {{"step", s.step}, {"value", std::move(values)}};
}

using series_book = std::map<std::string, std::map<std::string, series>>;

// One step's metrics into the book; a re-run step after a resume replaces
// what it re-runs.
void add_step(series_book& book, const j::metrics_reported& m) {
  auto& stage = book[m.stage];
  for (const auto& [k, x] : m.metrics) {
    auto& s = stage[k];
    while (!s.step.empty() && s.step.back() >= m.step)
      s.step.pop_back(), s.value.pop_back();
    s.step.push_back(m.step), s.value.push_back(x);
  }
}

// The last events a page lists (not metrics) and the last evaluation samples.
struct recent_events {
  std::deque<j::event> events, samples;
  void add(const j::event& e) {
    if (std::holds_alternative<j::metrics_reported>(e.body))
      return;
    if (std::holds_alternative<j::eval_samples>(e.body)) {
      samples.push_back(e);
      if (samples.size() > 5)
        samples.pop_front();
    }
    events.push_back(e);
    if (events.size() > 300)
      events.pop_front();
  }
};

// A final job's page from its files: metrics.jsonl for the series (fast to
// scan), the journal's last 256 KiB for the recent events (some 50 steps).
expected<void> read_run_files(const std::string& run_dir, series_book& book, recent_events& recent) {
  namespace fs = std::filesystem;
  auto metrics = runtime::read_file((fs::path{run_dir} / "metrics.jsonl").string());
  if (!metrics)
    return metrics.error();
  j::each_metrics_line(*metrics, [&](const j::metrics_reported& m) { add_step(book, m); });
  std::ifstream in(fs::path{run_dir} / "events.jsonl", std::ios::binary | std::ios::ate);
  if (!in)
    return {};
  const std::streamoff window = 256 << 10;
  auto size = static_cast<std::streamoff>(in.tellg());
  auto from = std::max<std::streamoff>(0, size - window);
  std::string tail(static_cast<size_t>(size - from), '\0');
  in.seekg(from);
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  std::string_view text{tail};
  if (from > 0) // starts mid-line
    text.remove_prefix(std::min(text.size(), text.find('\n') + 1));
  j::each_journal_event(text, [&](const j::event& e) { recent.add(e); });
  return {};
}

// What a job page loads first: the job, its series (thinned), its last
// events and evaluation samples, and where the live stream goes on.
json snapshot(controller& ctl, const job_view& v, size_t max_points) {
  series_book book;
  recent_events recent;
  int64_t last_seq = v.status.last_seq;
  bool from_files = is_final(v.state) && !v.run_dir.empty() && read_run_files(v.run_dir, book, recent);
  if (!from_files) {
    book.clear(), recent = {};
    auto next = each_event_so_far(ctl, v.status.id, 1, [&](const j::event& e) {
      if (auto* m = std::get_if<j::metrics_reported>(&e.body))
        add_step(book, *m);
      recent.add(e);
    });
    if (next)
      last_seq = *next - 1;
  }
  auto as_json = [](const std::deque<j::event>& es) {
    json out = json::array();
    for (const auto& e : es)
      out.push_back(event_json(e));
    return out;
  };
  json out;
  out["job"] = job_json(v, true);
  json s = json::object();
  for (const auto& [stage, keys] : book)
    for (const auto& [k, x] : keys)
      s[stage][k] = series_json(thin(x, max_points));
  out["series"] = std::move(s);
  out["events"] = as_json(recent.events);
  out["samples"] = as_json(recent.samples);
  out["last_seq"] = last_seq;
  return out;
}

std::string cookie_value(const httplib::Request& req, const std::string& name) {
  auto header = req.get_header_value("Cookie");
  size_t pos = 0;
  while (pos < header.size()) {
    auto end = header.find(';', pos);
    if (end == std::string::npos)
      end = header.size();
    auto part = header.substr(pos, end - pos);
    auto b = part.find_first_not_of(' ');
    if (b != std::string::npos && part.compare(b, name.size() + 1, name + "=") == 0)
      return part.substr(b + name.size() + 1);
    pos = end + 1;
  }
  return {};
}

} // namespace

// ---- the server ----

struct dashboard::impl {
  impl(controller& c, dashboard_options o) : ctl(c), opt(std::move(o)) {}

  controller& ctl;
  dashboard_options opt;
  std::unique_ptr<httplib::Server> server;
  std::thread thread;
  int port = 0;
  bool tls = false;

  struct session {
    std::string csrf;
    int64_t expires_us = 0;
  };
  std::mutex mu;
  std::unordered_map<std::string, session> sessions;
  int streams = 0;
  std::atomic<bool> stopping{false};

  // ---- sessions ----

  std::optional<session> session_of(const httplib::Request& req) {
    auto id = cookie_value(req, kCookie);
    if (id.empty())
      return std::nullopt;
    std::lock_guard l{mu};
    auto it = sessions.find(id);
    if (it == sessions.end() || it->second.expires_us < j::now_us())
      return std::nullopt;
    return it->second;
  }

  std::string who(const httplib::Request& req) const {
    return "http:" + req.remote_addr + ":" + std::to_string(req.remote_port) + " dashboard";
  }

  expected<std::string> new_session() {
    auto id = make_token();
    auto csrf = make_token();
    if (!id || !csrf)
      return make_error(errc::internal, "no randomness for a session");
    std::lock_guard l{mu};
    auto now = j::now_us();
    for (auto it = sessions.begin(); it != sessions.end();)
      it = it->second.expires_us < now ? sessions.erase(it) : std::next(it);
    if (sessions.size() >= 1024) // bounded: the oldest to expire goes
      sessions.erase(std::min_element(sessions.begin(), sessions.end(), [](const auto& a, const auto& b) {
        return a.second.expires_us < b.second.expires_us;
      }));
    sessions[*id] = {*csrf, now + static_cast<int64_t>(opt.session_hours * 3600e6)};
    return *id;
  }

  std::string cookie(const std::string& id, int64_t max_age_s) const {
    return std::string{kCookie} + "=" + id + "; Path=/; HttpOnly; SameSite=Strict; Max-Age=" +
           std::to_string(max_age_s) + (tls ? "; Secure" : "");
  }

  // The session of a read; else 401 (API) and false.
  bool reader(const httplib::Request& req, httplib::Response& res) {
    if (session_of(req))
      return true;
    reply_status(res, 401, "log in first (POST /login with the controller's token)");
    return false;
  }

  // A mutating call's checks: session, CSRF token, same origin.
  bool writer(const httplib::Request& req, httplib::Response& res, const std::string& csrf_given) {
    auto s = session_of(req);
    if (!s) {
      reply_status(res, 401, "log in first");
      return false;
    }
    if (!same_secret(csrf_given, s->csrf)) {
      reply_status(res, 403, "missing or wrong CSRF token (X-CSRF-Token)");
      return false;
    }
    auto origin = req.get_header_value("Origin");
    auto host = req.get_header_value("Host");
    if (!origin.empty() && origin != (tls ? "https://" : "http://") + host) {
      reply_status(res, 403, "cross-origin request refused (Origin " + origin.substr(0, 100) + ")");
      return false;
    }
    return true;
  }

  // ---- routes ----

  void asset(httplib::Response& res, const std::string& name) {
    auto* a = find_web_asset(name);
    if (!a) {
      res.status = 404;
      return;
    }
    res.set_content(std::string{a->bytes}, std::string{a->content_type}.c_str());
  }

  void page(const httplib::Request& req, httplib::Response& res) {
    if (!session_of(req))
      return res.set_redirect("/login", 303);
    asset(res, "index.html");
  }

  void login_form(httplib::Response& res, const std::string& error) {
    auto* a = find_web_asset("login.html");
    std::string html{a->bytes};
    if (!error.empty()) {
      auto at = html.find("<!--error-->");
      if (at != std::string::npos)
        html.replace(at, 12, "<p class=\"error\" id=\"login-error\">" + error + "</p>");
    }
    res.set_content(html, "text/html; charset=utf-8");
  }

  void login(const httplib::Request& req, httplib::Response& res) {
    auto token = req.get_param_value("token");
    bool ok = same_secret(token, opt.token);
    (void)ctl.store().audit(
        {j::now_us(), who(req), "dashboard login", "", ok ? "ok" : "UNAUTHENTICATED: wrong token"});
    if (!ok) {
      res.status = 401;
      return login_form(res, "Wrong token.");
    }
    auto id = new_session();
    if (!id) {
      res.status = 500;
      return login_form(res, "Could not open a session.");
    }
    res.set_header("Set-Cookie", cookie(*id, static_cast<int64_t>(opt.session_hours * 3600)));
    res.set_redirect("/", 303);
  }

  void logout(const httplib::Request& req, httplib::Response& res) {
    if (!writer(req, res, req.get_param_value("csrf")))
      return;
    {
      std::lock_guard l{mu};
      sessions.erase(cookie_value(req, kCookie));
    }
    res.set_header("Set-Cookie", cookie("", 0));
    res.set_redirect("/login", 303);
  }

  void jobs(const httplib::Request& req, httplib::Response& res) {
    if (!reader(req, res))
      return;
    json list = json::array();
    for (const auto& v : ctl.list({}, 500))
      list.push_back(job_json(v, false));
    reply_json(res, {{"jobs", std::move(list)}});
  }

  void job(const httplib::Request& req, httplib::Response& res, const std::string& id) {
    if (!reader(req, res))
      return;
    auto v = ctl.get(id);
    if (!v)
      return reply_error(res, v.error());
    reply_json(res, job_json(*v, true));
  }

  void job_snapshot(const httplib::Request& req, httplib::Response& res, const std::string& id) {
    if (!reader(req, res))
      return;
    auto v = ctl.get(id);
    if (!v)
      return reply_error(res, v.error());
    size_t points = static_cast<size_t>(opt.max_points);
    if (req.has_param("points")) {
      auto p = req.get_param_value("points");
      if (p.empty() || p.size() > 6 || p.find_first_not_of("0123456789") != std::string::npos)
        return reply_status(res, 400, "points: expected a whole number up to 100000");
      points = std::clamp<size_t>(std::stoul(p), 4, 100000);
    }
    reply_json(res, snapshot(ctl, *v, points));
  }

  void job_processes(const httplib::Request& req, httplib::Response& res, const std::string& id) {
    if (!reader(req, res))
      return;
    auto v = ctl.get(id);
    if (!v)
      return reply_error(res, v.error());
    json out = json::array();
    for (const auto& p : processes_of(*v))
      out.push_back({{"node", p.node},
                     {"process", p.process},
                     {"pid", p.pid},
                     {"alive", p.alive},
                     {"rss_bytes", p.rss_bytes}});
    reply_json(res, {{"processes", std::move(out)}});
  }

  void command(const httplib::Request& req, httplib::Response& res, const std::string& id,
               const std::string& what) {
    if (!writer(req, res, req.get_header_value("X-CSRF-Token"))) {
      auto refused = res.status == 401 ? "UNAUTHENTICATED: " : "PERMISSION_DENIED: ";
      (void)ctl.store().audit({j::now_us(), who(req), "dashboard " + what, id.substr(0, 128),
                               refused + res.body.substr(0, 200)});
      return;
    }
    // Shared: a reply that comes after the wait below gave up finds it alive.
    auto p = std::make_shared<std::promise<expected<job_view>>>();
    auto f = p->get_future();
    auto done = [p](expected<job_view> v) { p->set_value(std::move(v)); };
    if (what == "pause")
      ctl.pause(id, done);
    else if (what == "resume")
      ctl.resume(id, done);
    else if (what == "checkpoint")
      ctl.checkpoint(id, done);
    else
      ctl.cancel(id, false, done);
    auto wait = std::chrono::duration<double>(ctl.options().command_timeout_s + 5);
    expected<job_view> v = make_error(errc::timeout, what + ": no answer from the job in time");
    if (f.wait_for(wait) == std::future_status::ready)
      v = f.get();
    (void)ctl.store().audit({j::now_us(), who(req), "dashboard " + what, id.substr(0, 128),
                             v ? "ok"
                               : grpc_status_name(grpc_code_of(code_of(v.error()))) + ": " +
                                     describe(v.error()).substr(0, 400)});
    if (!v)
      return reply_error(res, v.error());
    reply_json(res, job_json(*v, true));
  }

  void prometheus(const httplib::Request& req, httplib::Response& res) {
    auto auth = req.get_header_value("Authorization");
    const std::string bearer = "Bearer ";
    bool ok = session_of(req) ||
              (auth.rfind(bearer, 0) == 0 && same_secret(std::string_view{auth}.substr(bearer.size()), opt.token));
    if (!ok) {
      res.status = 401;
      res.set_header("WWW-Authenticate", "Bearer");
      res.set_content("unauthorized: send 'Authorization: Bearer <token>'\n", "text/plain");
      return;
    }
    res.set_content(prometheus_text(ctl.list({}, 0)), "text/plain; version=0.0.4; charset=utf-8");
  }

  // ---- the event stream (Server-Sent Events) ----

  struct stream_state {
    std::mutex mu;
    std::condition_variable cv;
    bool woken = false;
    std::unique_ptr<event_cursor> cursor;
  };

  void events(const httplib::Request& req, httplib::Response& res, const std::string& id) {
    if (!reader(req, res))
      return;
    // Where to go on: the browser's Last-Event-ID after a reconnect, else ?from.
    int64_t from = 1;
    auto last = req.get_header_value("Last-Event-ID");
    auto given = !last.empty() ? last : req.get_param_value("from");
    if (!given.empty()) {
      if (given.size() > 18 || given.find_first_not_of("0123456789") != std::string::npos)
        return reply_status(res, 400, "from / Last-Event-ID: expected a sequence number");
      from = std::stoll(given) + (last.empty() ? 0 : 1);
    }
    {
      std::lock_guard l{mu};
      if (streams >= opt.max_streams)
        return reply_status(res, 503, "too many open event streams; try again later");
      ++streams;
    }
    auto st = std::make_shared<stream_state>();
    auto cur = ctl.watch(id, from, [st] {
      std::lock_guard l{st->mu};
      st->woken = true;
      st->cv.notify_all();
    });
    if (!cur) {
      end_stream();
      return reply_error(res, cur.error());
    }
    st->cursor = std::move(*cur);
    res.set_header("Cache-Control", "no-store");
    res.set_header("X-Accel-Buffering", "no");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st](size_t, httplib::DataSink& sink) { return pump(*st, sink); },
        [this, st](bool) {
          st->cursor.reset();
          end_stream();
        });
  }

  void end_stream() {
    std::lock_guard l{mu};
    --streams;
  }

  // Writes what the cursor has, or waits for more (a comment line every
  // 15 s keeps proxies and the browser from timing out). False = stop.
  bool pump(stream_state& st, httplib::DataSink& sink) {
    if (stopping || !sink.is_writable())
      return false;
    auto b = st.cursor->next(256);
    std::string out;
    for (const auto& e : b.events)
      out += "id: " + std::to_string(e.seq) + "\nevent: event\ndata: " + j::to_json(e) + "\n\n";
    if (b.final)
      out += "event: end\ndata: " + job_json(*b.final, false).dump() + "\n\n";
    if (!out.empty() && !sink.write(out.data(), out.size()))
      return false;
    if (b.final) {
      sink.done();
      return true;
    }
    if (b.events.empty()) {
      std::unique_lock l{st.mu};
      // In steps of a second, so that a stopping server is not held up.
      for (int i = 0; i < 15 && !st.woken && !stopping; ++i)
        st.cv.wait_for(l, std::chrono::seconds(1));
      if (!st.woken) {
        static const std::string ping = ": keep-alive\n\n";
        return !stopping && sink.write(ping.data(), ping.size());
      }
      st.woken = false;
    }
    return !stopping;
  }

  void routes() {
    auto& s = *server;
    s.Get("/", [this](const httplib::Request& q, httplib::Response& r) { page(q, r); });
    s.Get(R"(/jobs/([A-Za-z0-9_.-]{1,128}))", [this](const httplib::Request& q, httplib::Response& r) { page(q, r); });
    s.Get("/login", [this](const httplib::Request&, httplib::Response& r) { login_form(r, ""); });
    s.Post("/login", [this](const httplib::Request& q, httplib::Response& r) { login(q, r); });
    s.Post("/logout", [this](const httplib::Request& q, httplib::Response& r) { logout(q, r); });
    s.Get(R"(/assets/([A-Za-z0-9_.-]{1,64}))",
          [this](const httplib::Request& q, httplib::Response& r) { asset(r, q.matches[1]); });
    s.Get("/api/session", [this](const httplib::Request& q, httplib::Response& r) {
      auto ses = session_of(q);
      if (!ses)
        return reply_status(r, 401, "log in first");
      reply_json(r, {{"csrf", ses->csrf}, {"expires_us", ses->expires_us}});
    });
    s.Get("/api/jobs", [this](const httplib::Request& q, httplib::Response& r) { jobs(q, r); });
    const std::string job_path = R"(/api/jobs/([A-Za-z0-9_.-]{1,128}))";
    s.Get(job_path, [this](const httplib::Request& q, httplib::Response& r) { job(q, r, q.matches[1]); });
    s.Get(job_path + "/snapshot",
          [this](const httplib::Request& q, httplib::Response& r) { job_snapshot(q, r, q.matches[1]); });
    s.Get(job_path + "/processes",
          [this](const httplib::Request& q, httplib::Response& r) { job_processes(q, r, q.matches[1]); });
    s.Get(job_path + "/events",
          [this](const httplib::Request& q, httplib::Response& r) { events(q, r, q.matches[1]); });
    s.Post(job_path + "/(pause|resume|checkpoint|cancel)",
           [this](const httplib::Request& q, httplib::Response& r) { command(q, r, q.matches[1], q.matches[2]); });
    s.Get("/metrics", [this](const httplib::Request& q, httplib::Response& r) { prometheus(q, r); });
  }

  void configure() {
    auto& s = *server;
    s.new_task_queue = [n = opt.max_streams + 16] { return new httplib::ThreadPool(static_cast<size_t>(n)); };
    s.set_payload_max_length(64 << 10);
    s.set_read_timeout(10, 0);
    s.set_write_timeout(10, 0);
    s.set_default_headers({
        {"X-Content-Type-Options", "nosniff"},
        {"X-Frame-Options", "DENY"},
        {"Referrer-Policy", "no-referrer"},
        {"Content-Security-Policy",
         "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
         "connect-src 'self'; frame-ancestors 'none'; form-action 'self'"},
    });
    // cpp-httplib compresses with brotli at its slowest quality whenever
    // a client accepts it: 1.7 s for a 1 MB job snapshot, where gzip takes
    // 0.14 s (measured). Offer it gzip only. (The request object is httplib's
    // own non-const one, handed to this hook as const.)
    s.set_pre_routing_handler([](const httplib::Request& q, httplib::Response&) {
      auto& headers = const_cast<httplib::Request&>(q).headers;
      auto it = headers.find("Accept-Encoding");
      if (it != headers.end()) {
        bool gzip = it->second.find("gzip") != std::string::npos;
        headers.erase(it);
        if (gzip)
          headers.emplace("Accept-Encoding", "gzip");
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    s.set_exception_handler([](const httplib::Request&, httplib::Response& r, std::exception_ptr) {
      reply_status(r, 500, "internal error");
    });
    routes();
  }
};

expected<std::unique_ptr<dashboard>> dashboard::start(controller& ctl, const dashboard_options& o) {
  auto addr = parse_listen_address(o.listen);
  if (!addr)
    return with_prefix(addr.error(), "dashboard listen");
  auto [host, port] = *addr;
  if (!is_loopback_host(host) && !o.tls.enabled())
    return make_error(errc::invalid_argument,
                      "dashboard listen " + o.listen +
                          ": refusing to serve a non-loopback address without TLS (set tls.cert and tls.key)");
  std::unique_ptr<dashboard> d{new dashboard};
  d->impl_ = std::make_unique<impl>(ctl, o);
  auto& m = *d->impl_;
  if (o.tls.enabled()) {
    if (o.tls.cert_file.empty() || o.tls.key_file.empty())
      return make_error(errc::invalid_argument, "dashboard TLS needs both tls.cert and tls.key");
    auto ssl = std::make_unique<httplib::SSLServer>(o.tls.cert_file.c_str(), o.tls.key_file.c_str());
    if (!ssl->is_valid())
      return make_error(errc::invalid_argument,
                        "dashboard TLS: cannot load " + o.tls.cert_file + " / " + o.tls.key_file);
    m.server = std::move(ssl);
    m.tls = true;
  } else {
    m.server = std::make_unique<httplib::Server>();
  }
  m.configure();
  if (port == 0)
    m.port = m.server->bind_to_any_port(host);
  else
    m.port = m.server->bind_to_port(host, port) ? port : -1;
  if (m.port <= 0)
    return make_error(errc::unavailable, "dashboard: cannot listen on " + o.listen);
  m.thread = std::thread([&m] { m.server->listen_after_bind(); });
  return d;
}

int dashboard::port() const {
  return impl_->port;
}

void dashboard::stop() {
  auto& m = *impl_;
  if (m.stopping.exchange(true))
    return;
  m.server->stop();
  if (m.thread.joinable())
    m.thread.join();
}

dashboard::~dashboard() {
  stop();
}

} // namespace troupe::cluster
