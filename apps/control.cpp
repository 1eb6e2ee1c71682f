#include "apps/control.hpp"

#include "actors/actor_system.hpp"
#include "apps/console.hpp"
#include "cluster/api_client.hpp"
#include "cluster/api_server.hpp"
#include "cluster/dashboard.hpp"
#include "cluster/controller_config.hpp"
#include "cluster/local_launcher.hpp"
#include "cluster/node_agent.hpp"
#include "cluster/workers.hpp"
#include "runtime/file_io.hpp"

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <thread>
#include <iostream>
#include <unistd.h>

namespace troupe::apps {

namespace fs = std::filesystem;
namespace j = actors::job;
using cluster::ctl_state;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::string first_of(std::initializer_list<std::string> xs) {
  for (const auto& x : xs)
    if (!x.empty())
      return x;
  return {};
}

// $XDG_STATE_HOME/troupe, else ~/.local/state/troupe.
std::string default_state_dir() {
  if (auto x = env("XDG_STATE_HOME"); !x.empty())
    return x + "/troupe";
  if (auto h = env("HOME"); !h.empty())
    return h + "/.local/state/troupe";
  return ".troupe";
}

void print_error(const char* cmd, const caf::error& err) {
  std::fprintf(stderr, "troupe %s: %s\n", cmd, describe(err).c_str());
  auto v = violations_of(err);
  if (v.size() > 1)
    for (const auto& line : v)
      std::fprintf(stderr, "  %s\n", line.c_str());
}

std::string when(int64_t us) {
  if (us <= 0)
    return "-";
  std::time_t t = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  ::localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

int exit_code_of(ctl_state s) {
  switch (s) {
  case ctl_state::succeeded: return 0;
  case ctl_state::cancelled: return 130;
  default: return 1;
  }
}

// ---- the controller ----

// "host:port" as clients dial it (IPv6 hosts in brackets).
std::string address_of(const std::string& listen, int port) {
  auto host = cluster::parse_listen_address(listen)->first;
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

expected<cluster::controller_file> controller_settings(const controller_command_options& o) {
  cluster::controller_file f;
  if (!o.config_path.empty()) {
    auto loaded = runtime::load_config_file<cluster::controller_file>(o.config_path);
    if (!loaded)
      return loaded.error();
    f = std::move(*loaded);
  }
  if (!o.listen.empty())
    f.listen = o.listen;
  auto& c = f.controller;
  if (!o.state_dir.empty())
    c.state_dir = o.state_dir;
  if (c.state_dir.empty())
    c.state_dir = default_state_dir();
  if (o.max_running_jobs > 0)
    c.max_running_jobs = o.max_running_jobs;
  if (!o.on_shutdown.empty())
    c.on_shutdown = o.on_shutdown;
  if (!o.tls_cert.empty())
    f.tls.cert_file = o.tls_cert;
  if (!o.tls_key.empty())
    f.tls.key_file = o.tls_key;
  if (!o.tls_client_ca.empty())
    f.tls.client_ca_file = o.tls_client_ca;
  if (!o.dashboard.empty())
    f.dashboard.listen = o.dashboard == "off" ? "" : o.dashboard;
  if (c.on_shutdown != "checkpoint" && c.on_shutdown != "drain" && c.on_shutdown != "detach")
    return make_error(errc::invalid_argument,
                      "--on-shutdown: '" + c.on_shutdown + "' is not checkpoint, drain or detach");
  return f;
}

// SIGINT and SIGTERM, blocked (taken by sigwait) before any thread starts.
sigset_t block_stop_signals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  return stop;
}

// The controller's two faces: the gRPC API and (unless off) the dashboard.
struct faces {
  std::unique_ptr<cluster::api_server> api;
  std::unique_ptr<cluster::dashboard> web;
  std::string address;   // host:port of the API
  std::string dashboard; // its URL, "" when off
};

// The API token and the secret node agents join with, from the state dir
// (created there, mode 0600, on the first start).
struct secrets {
  std::string token;
  std::string token_path;
  std::string cluster_secret;
  std::string cluster_secret_path;
};

expected<secrets> load_secrets(const std::string& state_dir) {
  secrets s;
  s.token_path = (fs::path{state_dir} / cluster::token_file_name).string();
  s.cluster_secret_path = (fs::path{state_dir} / cluster::cluster_secret_file_name).string();
  auto token = cluster::load_or_create_token(s.token_path);
  if (!token)
    return token.error();
  auto secret = cluster::load_or_create_token(s.cluster_secret_path);
  if (!secret)
    return secret.error();
  s.token = *token;
  s.cluster_secret = *secret;
  return s;
}

expected<faces> serve(cluster::controller& ctl, const cluster::controller_file& f, const secrets& keys) {
  faces out;
  cluster::api_options ao;
  ao.listen = f.listen;
  ao.tls = f.tls;
  ao.token = keys.token;
  ao.cluster_secret = keys.cluster_secret;
  ao.max_message_bytes = f.max_message_bytes;
  auto api = cluster::api_server::start(ctl, ao);
  if (!api)
    return api.error();
  out.api = std::move(*api);
  out.address = address_of(f.listen, out.api->port());
  if (f.dashboard.listen.empty())
    return out;
  auto d = f.dashboard;
  d.tls = f.tls;
  d.token = keys.token;
  auto web = cluster::dashboard::start(ctl, d);
  if (!web)
    return web.error();
  out.web = std::move(*web);
  out.dashboard = std::string{f.tls.enabled() ? "https://" : "http://"} +
                  address_of(f.dashboard.listen, out.web->port());
  return out;
}

// <state dir>/controller.json: where clients find this controller.
expected<std::string> write_info(const std::string& state_dir, const faces& x, bool tls) {
  auto path = (fs::path{state_dir} / cluster::controller_info_file).string();
  nlohmann::json info{{"address", x.address}, {"pid", static_cast<int64_t>(::getpid())}, {"tls", tls}};
  if (!x.dashboard.empty())
    info["dashboard"] = x.dashboard;
  if (auto ok = runtime::write_file_atomic(path, info.dump() + "\n"); !ok)
    return ok.error();
  return path;
}

} // namespace

int controller_command(const controller_command_options& o) {
  auto f = controller_settings(o);
  if (!f)
    return print_error("controller", f.error()), 2;
  auto stop_signals = block_stop_signals();
  auto exe = cluster::self_executable();
  if (!exe)
    return print_error("controller", exe.error()), 2;
  auto co = f->controller;
  co.executable = *exe;
  if (!o.advertise.empty())
    co.advertise = o.advertise;
  if (co.advertise.empty()) {
    // Listening on one address: the nodes reach this machine there.
    auto host = cluster::parse_listen_address(f->listen);
    if (host && host->first != "0.0.0.0" && host->first != "::" && !host->first.empty())
      co.advertise = host->first;
  }

  caf::actor_system_config sys_cfg;
  actors::configure(sys_cfg);
  cluster::configure_network(sys_cfg);
  caf::actor_system sys{sys_cfg};
  auto ctl = cluster::controller::open(sys, co);
  if (!ctl)
    return print_error("controller", ctl.error()), 2;
  const auto& state_dir = (*ctl)->options().state_dir;
  auto keys = load_secrets(state_dir);
  if (!keys)
    return print_error("controller", keys.error()), 2;
  auto up = serve(**ctl, *f, *keys);
  if (!up)
    return print_error("controller", up.error()), 2;
  auto info_path = write_info(state_dir, *up, f->tls.enabled());
  if (!info_path)
    return print_error("controller", info_path.error()), 2;
  std::fprintf(stderr, "troupe controller: listening on %s%s; state dir %s; token in %s; cluster secret in %s\n",
               up->address.c_str(), f->tls.enabled() ? " (TLS)" : "", state_dir.c_str(),
               keys->token_path.c_str(), keys->cluster_secret_path.c_str());
  if (up->web)
    std::fprintf(stderr, "troupe controller: dashboard and /metrics on %s\n", up->dashboard.c_str());

  int sig = 0;
  sigwait(&stop_signals, &sig);
  std::fprintf(stderr, "troupe controller: %s: shutting down (running jobs: %s)\n", strsignal(sig),
               f->controller.on_shutdown.c_str());
  up->api->set_not_serving();
  if (up->web)
    up->web->stop();
  (*ctl)->shutdown();
  up->api->shutdown(5);
  std::error_code ec;
  fs::remove(*info_path, ec);
  std::fprintf(stderr, "troupe controller: stopped\n");
  return 0;
}

// ---- the client ----

namespace {

// Where the controller is and how to reach it (no credentials): flags,
// environment, the client file, then a controller on this machine.
struct client_place {
  cluster::client_file file;
  std::string state_dir;
  cluster::client_options options;
};

expected<client_place> place_of(const client_flags& c) {
  client_place p;
  auto file_path = first_of({env("TROUPE_CLIENT_CONFIG"),
                             env("HOME").empty() ? "" : env("HOME") + "/.config/troupe/client.yaml"});
  std::error_code ec;
  if (!file_path.empty() && fs::exists(file_path, ec)) {
    auto loaded = runtime::load_config_file<cluster::client_file>(file_path);
    if (!loaded)
      return loaded.error();
    p.file = std::move(*loaded);
  }
  p.state_dir = first_of({c.state_dir, env("TROUPE_STATE_DIR"), default_state_dir()});
  auto& o = p.options;
  o.address = first_of({c.address, env("TROUPE_ADDRESS"), p.file.address});
  if (o.address.empty()) {
    auto text = runtime::read_file((fs::path{p.state_dir} / cluster::controller_info_file).string());
    if (!text)
      return make_error(errc::not_found,
                        "no controller address: pass --address, set TROUPE_ADDRESS, or start "
                        "`troupe controller` on this machine (none found in " + p.state_dir + ")");
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.contains("address") || !j["address"].is_string())
      return make_error(errc::parse_error, p.state_dir + "/controller.json: no address");
    o.address = j["address"].get<std::string>();
  }
  o.ca_file = first_of({c.tls_ca, env("TROUPE_TLS_CA"), p.file.tls_ca});
  o.cert_file = first_of({c.tls_cert, env("TROUPE_TLS_CERT"), p.file.tls_cert});
  o.key_file = first_of({c.tls_key, env("TROUPE_TLS_KEY"), p.file.tls_key});
  o.timeout_s = c.timeout_s;
  o.user = env("USER");
  return p;
}

expected<cluster::client_options> client_settings(const client_flags& c) {
  auto p = place_of(c);
  if (!p)
    return p.error();
  auto o = p->options;
  o.token = first_of({c.token, env("TROUPE_TOKEN")});
  if (o.token.empty()) {
    auto path = first_of({c.token_file, env("TROUPE_TOKEN_FILE"), p->file.token_file,
                          (fs::path{p->state_dir} / cluster::token_file_name).string()});
    auto token = cluster::read_token_file(path);
    if (!token)
      return make_error(errc::not_found, "no API token: cannot read " + path +
                                             " (pass --token-file or set TROUPE_TOKEN_FILE)");
    o.token = *token;
  }
  return o;
}

expected<cluster::api_client> connect(const client_flags& c) {
  auto o = client_settings(c);
  if (!o)
    return o.error();
  return cluster::api_client::connect(*o);
}

std::string progress_of(const cluster::job_view& v) {
  if (v.status.stage.empty())
    return "-";
  return v.status.stage + " " + std::to_string(v.status.iteration) + "/" + std::to_string(v.status.total);
}

void print_status(const cluster::job_view& v) {
  const auto& s = v.status;
  std::printf("id:        %s\n", s.id.c_str());
  std::printf("name:      %s\n", s.name.c_str());
  std::printf("state:     %s", std::string{to_string(v.state)}.c_str());
  if (v.state == ctl_state::queued && v.queue_position > 0)
    std::printf(" (position %d)", v.queue_position);
  if (!s.phase.empty())
    std::printf(" (phase %s)", s.phase.c_str());
  std::printf("\n");
  if (!v.wait_reason.empty())
    std::printf("waiting:   %s\n", v.wait_reason.c_str());
  if (!v.nodes.empty()) {
    std::printf("nodes:    ");
    for (size_t i = 0; i < v.nodes.size(); ++i)
      std::printf(" %zu=%s", i, v.nodes[i].c_str());
    std::printf("\n");
  }
  std::printf("progress:  %s", progress_of(v).c_str());
  if (std::isfinite(s.eta_s))
    std::printf("  eta %s", duration(s.eta_s).c_str());
  std::printf("\n");
  std::printf("submitted: %s\nstarted:   %s\nended:     %s\n", when(v.submit_time_us).c_str(),
              when(s.start_time_us).c_str(), when(v.end_time_us).c_str());
  std::printf("run dir:   %s\n", v.run_dir.c_str());
  if (!s.error.empty())
    std::printf("error:     %s\n", s.error.c_str());
  if (!v.exit_reason.empty())
    std::printf("driver:    pid %lld, %s\n", static_cast<long long>(v.driver_pid), v.exit_reason.c_str());
  if (v.resumable)
    std::printf("resumable: yes — `troupe resume %s` continues from its last checkpoint\n", s.id.c_str());
  if (!s.weight_versions.empty()) {
    std::printf("weights:  ");
    for (const auto& [role, version] : s.weight_versions)
      std::printf(" %s=v%lld", role.c_str(), static_cast<long long>(version));
    std::printf("\n");
  }
  if (!s.last_metrics.empty()) {
    std::printf("metrics:\n");
    for (const char* key : {"critic/score/mean", "val/score/mean", "actor/pg_loss", "actor/reward_kl_penalty",
                            "critic/vf_loss", "sft/loss", "rm/loss", "rm/accuracy", "perf/throughput"})
      if (auto it = s.last_metrics.find(key); it != s.last_metrics.end())
        std::printf("  %-26s %.5g\n", key, it->second);
  }
  if (!v.roles.empty()) {
    std::printf("roles:\n");
    for (const auto& r : v.roles)
      std::printf("  %-4s %-10s rank %d  %-8s %s%s%s pid %lld%s%s\n", r.stage.c_str(), r.role.c_str(), r.rank,
                  r.status.c_str(), r.process.c_str(), r.node.empty() ? "" : " on ", r.node.c_str(),
                  static_cast<long long>(r.pid), r.reason.empty() ? "" : "  ", r.reason.c_str());
  }
}

nlohmann::json json_of(const cluster::job_view& v) {
  const auto& s = v.status;
  nlohmann::json j{{"id", s.id}, {"name", s.name}, {"state", std::string{to_string(v.state)}},
                   {"stage", s.stage}, {"iteration", s.iteration}, {"total", s.total},
                   {"phase", s.phase}, {"submit_time_us", v.submit_time_us},
                   {"start_time_us", s.start_time_us}, {"end_time_us", v.end_time_us},
                   {"error", s.error}, {"run_dir", v.run_dir}, {"driver_pid", v.driver_pid},
                   {"exit_reason", v.exit_reason}, {"resumable", v.resumable},
                   {"last_seq", s.last_seq}, {"metrics", s.last_metrics},
                   {"weight_versions", s.weight_versions}, {"nodes", v.nodes},
                   {"wait_reason", v.wait_reason}};
  j["eta_s"] = std::isfinite(s.eta_s) ? nlohmann::json(s.eta_s) : nlohmann::json(nullptr);
  return j;
}

// Streams the job's events to the terminal; the exit code of its end.
int follow_job(cluster::api_client& api, const std::string& id, bool show) {
  console_view view{show ? "auto" : "none"};
  auto final = api.watch(id, 1, [&](const j::event& e) { view.on_event(e); });
  if (!final)
    return print_error("watch", final.error()), 2;
  const auto& s = final->status;
  std::fprintf(stderr, "job %s %s%s%s\n", s.id.c_str(), std::string{to_string(final->state)}.c_str(),
               s.error.empty() ? "" : ": ", s.error.c_str());
  return exit_code_of(final->state);
}

// The wait reason of a job still queued after `seconds` (nullopt once it
// left the queue).
std::optional<std::string> stuck_in_queue(cluster::api_client& api, const std::string& id, double seconds) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  for (;;) {
    auto v = api.get(id);
    if (!v || v->state != ctl_state::queued)
      return std::nullopt;
    if (std::chrono::steady_clock::now() >= deadline)
      return v->wait_reason.empty() ? std::string{"still queued"} : v->wait_reason;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

} // namespace

int submit_command(const client_flags& c, const submit_command_options& o) {
  std::vector<runtime::yaml_document::source_file> sources;
  // The job file and every base it names are read here and sent; the
  // controller never opens a spec's files on its own disk.
  auto doc = runtime::yaml_document::from_file(o.file, &sources);
  if (!doc)
    return print_error("submit", doc.error()), 2;
  auto api = connect(c);
  if (!api)
    return print_error("submit", api.error()), 2;
  cluster::submit_request r;
  r.spec_name = sources.front().name;
  r.spec_text = sources.front().text;
  for (size_t i = 1; i < sources.size(); ++i)
    r.bases.emplace_back(sources[i].name, sources[i].text);
  r.overrides = o.overrides;
  r.name = o.name;
  auto v = api->submit(r);
  if (!v)
    return print_error("submit", v.error()), 2;
  std::printf("%s\n", v->status.id.c_str());
  std::fflush(stdout);
  if (!o.wait && !o.follow)
    return 0;
  if (o.give_up_queued_s > 0)
    if (auto stuck = stuck_in_queue(*api, v->status.id, o.give_up_queued_s)) {
      (void)api->cancel(v->status.id, true);
      std::fprintf(stderr, "troupe submit: job %s cannot start: %s\n", v->status.id.c_str(), stuck->c_str());
      return 2;
    }
  return follow_job(*api, v->status.id, o.follow);
}

int jobs_command(const client_flags& c, const std::vector<std::string>& states, int limit) {
  std::vector<ctl_state> filter;
  for (const auto& s : states) {
    auto st = cluster::parse_ctl_state(s);
    if (!st)
      return std::fprintf(stderr, "troupe jobs: --state: '%s' is not a job state\n", s.c_str()), 2;
    filter.push_back(*st);
  }
  auto api = connect(c);
  if (!api)
    return print_error("jobs", api.error()), 2;
  auto jobs = api->list(filter, limit);
  if (!jobs)
    return print_error("jobs", jobs.error()), 2;
  std::printf("%-16s %-20s %-10s %-14s %-19s %s\n", "ID", "NAME", "STATE", "PROGRESS", "SUBMITTED", "ERROR");
  for (const auto& v : *jobs)
    std::printf("%-16s %-20s %-10s %-14s %-19s %s\n", v.status.id.c_str(), v.status.name.substr(0, 20).c_str(),
                std::string{to_string(v.state)}.c_str(), progress_of(v).c_str(),
                when(v.submit_time_us).c_str(), v.status.error.substr(0, 60).c_str());
  return 0;
}

int status_command(const client_flags& c, const std::string& id, bool json) {
  auto api = connect(c);
  if (!api)
    return print_error("status", api.error()), 2;
  auto v = api->get(id);
  if (!v)
    return print_error("status", v.error()), 2;
  if (json)
    std::printf("%s\n", json_of(*v).dump(2).c_str());
  else
    print_status(*v);
  return 0;
}

int logs_command(const client_flags& c, const std::string& id, bool follow, int lines) {
  auto api = connect(c);
  if (!api)
    return print_error("logs", api.error()), 2;
  auto ok = api->logs(id, lines, follow, [](const cluster::log_entry& l) {
    std::printf("%s %-5s %s\n", when(l.time_us).c_str(), l.level.c_str(), l.text.c_str());
    std::fflush(stdout);
  });
  if (!ok)
    return print_error("logs", ok.error()), 2;
  return 0;
}

int watch_command(const client_flags& c, const std::string& id) {
  auto api = connect(c);
  if (!api)
    return print_error("watch", api.error()), 2;
  return follow_job(*api, id, true);
}

int job_command(const client_flags& c, const std::string& verb, const std::string& id, bool now) {
  auto api = connect(c);
  if (!api)
    return print_error(verb.c_str(), api.error()), 2;
  expected<cluster::job_view> v = make_error(errc::invalid_argument, "unknown command " + verb);
  if (verb == "cancel")
    v = api->cancel(id, now);
  else if (verb == "pause")
    v = api->pause(id);
  else if (verb == "resume")
    v = api->resume(id);
  else if (verb == "checkpoint")
    v = api->checkpoint(id);
  if (!v)
    return print_error(verb.c_str(), v.error()), 2;
  const char* note = verb == "pause"        ? " (pauses at the next phase boundary)"
                     : verb == "checkpoint" ? " (written at the next consistent boundary)"
                     : verb == "cancel" && !now ? " (stops at the next boundary, after a checkpoint)"
                                                : "";
  std::printf("job %s: %s requested; state %s%s\n", id.c_str(), verb.c_str(),
              std::string{to_string(v->state)}.c_str(), note);
  return 0;
}

int set_command(const client_flags& c, const std::string& id, const std::vector<std::string>& settings) {
  std::vector<std::pair<std::string, std::string>> kv;
  for (const auto& s : settings) {
    auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
      return std::fprintf(stderr, "troupe set: '%s': expected KEY=VALUE\n", s.c_str()), 2;
    kv.emplace_back(s.substr(0, eq), s.substr(eq + 1));
  }
  auto api = connect(c);
  if (!api)
    return print_error("set", api.error()), 2;
  auto v = api->update(id, kv);
  if (!v)
    return print_error("set", v.error()), 2;
  for (const auto& [k, val] : kv)
    std::printf("job %s: %s=%s (from the next iteration)\n", id.c_str(), k.c_str(), val.c_str());
  return 0;
}

int metrics_command(const client_flags& c, const std::string& id, const std::vector<std::string>& keys,
                    bool json) {
  auto api = connect(c);
  if (!api)
    return print_error("metrics", api.error()), 2;
  auto points = api->metrics(id, keys);
  if (!points)
    return print_error("metrics", points.error()), 2;
  for (const auto& p : *points) {
    if (json) {
      nlohmann::json j{{"stage", p.stage}, {"step", p.step}, {"time_us", p.time_us}};
      for (const auto& [k, v] : p.values)
        j[k] = v;
      std::printf("%s\n", j.dump().c_str());
    } else {
      std::printf("%s %lld", p.stage.c_str(), static_cast<long long>(p.step));
      for (const auto& [k, v] : p.values)
        std::printf("  %s=%.5g", k.c_str(), v);
      std::printf("\n");
    }
  }
  return 0;
}

// ---- nodes ----

namespace {

std::string gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  return buf;
}

} // namespace

int node_command(const client_flags& c, const node_command_options& n) {
  auto place = place_of(c);
  if (!place)
    return print_error("node", place.error()), cluster::agent_exit_refused;
  cluster::node_agent_options o;
  o.controller = place->options;
  auto secret = cluster::read_secret_file(
      first_of({n.secret_file, env("TROUPE_CLUSTER_SECRET_FILE"),
                (fs::path{place->state_dir} / cluster::cluster_secret_file_name).string()}));
  if (!secret)
    return print_error("node", with_prefix(secret.error(), "cluster secret (--secret FILE)")),
           cluster::agent_exit_refused;
  o.secret = *secret;
  o.name = n.name;
  o.advertise = n.advertise;
  o.resources = cluster::detect_resources();
  // Under srun: what the allocation gives this node.
  if (auto cpus = env("SLURM_CPUS_ON_NODE"); !cpus.empty() && n.cores < 0)
    o.resources.cores = std::max(1, std::atoi(cpus.c_str()));
  if (n.cores >= 0)
    o.resources.cores = n.cores;
  if (n.memory_gb >= 0)
    o.resources.memory_bytes = static_cast<int64_t>(n.memory_gb * (1LL << 30));
  if (n.gpus >= 0)
    o.resources.gpus = n.gpus;
  o.version = n.version;
  o.reconnect_s = n.reconnect_s;
  o.work_dir = n.work_dir;
  auto stop = block_stop_signals();
  return cluster::run_node_agent(o, stop);
}

int nodes_command(const client_flags& c, bool json) {
  auto api = connect(c);
  if (!api)
    return print_error("nodes", api.error()), 2;
  auto nodes = api->nodes();
  if (!nodes)
    return print_error("nodes", nodes.error()), 2;
  if (json) {
    auto out = nlohmann::json::array();
    for (const auto& v : *nodes)
      out.push_back({{"name", v.name}, {"state", std::string{to_string(v.state)}}, {"address", v.address},
                     {"peer", v.peer}, {"cores", v.resources.cores}, {"memory_bytes", v.resources.memory_bytes},
                     {"gpus", v.resources.gpus}, {"joined_time_us", v.joined_time_us},
                     {"last_heartbeat_us", v.last_heartbeat_us}, {"reason", v.reason},
                     {"version", v.version}, {"agent_pid", v.agent_pid}, {"state_time_us", v.state_time_us}});
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf("%-20s %-6s %-16s %5s %10s %4s %-10s %s\n", "NAME", "STATE", "ADDRESS", "CORES", "MEMORY", "GPUS",
              "HEARTBEAT", "REASON");
  auto now = static_cast<int64_t>(std::time(nullptr)) * 1000000;
  for (const auto& v : *nodes) {
    auto age = std::to_string(std::max<int64_t>(0, now - v.last_heartbeat_us) / 1000000) + "s ago";
    std::printf("%-20s %-6s %-16s %5d %10s %4d %-10s %s\n", v.name.c_str(), std::string{to_string(v.state)}.c_str(),
                v.address.c_str(), v.resources.cores, gib(v.resources.memory_bytes).c_str(), v.resources.gpus,
                age.c_str(), v.reason.c_str());
  }
  return 0;
}

} // namespace troupe::apps
