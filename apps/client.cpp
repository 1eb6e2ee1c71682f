// The client commands (apps/control.hpp): submit, jobs, status, logs,
// watch, cancel / pause / resume / checkpoint, set, metrics, nodes. They
// run in the lean `troupe` binary (NOTE [lean client] in apps/front.cpp):
// nothing here may reach LibTorch.
#include "apps/client.hpp"

#include "apps/console.hpp"
#include "runtime/config.hpp"
#include "runtime/file_io.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <thread>

namespace troupe::apps {

namespace fs = std::filesystem;
namespace j = actors::job;
using cluster::ctl_state;

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

namespace {

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
    for (const auto& r : v.roles) {
      // NOTE [supervision]: how often it restarted, and the last one's time.
      std::string restarts;
      if (r.attempt > 0)
        restarts =
            "  restarts " + std::to_string(r.attempt) +
            (r.recover_s > 0 ? " (last took " + std::to_string(r.recover_s).substr(0, 5) + " s)"
                             : "");
      std::printf("  %-4s %-10s rank %d  %-10s %s%s%s pid %lld%s%s%s\n", r.stage.c_str(),
                  r.role.c_str(), r.rank, r.status.c_str(), r.process.c_str(),
                  r.node.empty() ? "" : " on ", r.node.c_str(), static_cast<long long>(r.pid),
                  restarts.c_str(), r.reason.empty() ? "" : "  ", r.reason.c_str());
    }
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
  console_view view{show ? actors::rl::progress_style::automatic : actors::rl::progress_style::none};
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
