// The control plane's daemons (apps/control.hpp): `troupe controller` and
// `troupe node`. They run in the engine binary (NOTE [lean client] in
// apps/front.cpp); the client commands are in apps/client.cpp.
#include "apps/control.hpp"

#include "actors/actor_system.hpp"
#include "apps/client.hpp"
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
#include <filesystem>
#include <unistd.h>

namespace troupe::apps {

namespace fs = std::filesystem;

namespace {

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
  if (!o.on_shutdown.empty()) {
    auto policy = enum_from_name<cluster::shutdown_policy>(o.on_shutdown);
    if (!policy)
      return make_error(errc::invalid_argument, "--on-shutdown: '" + o.on_shutdown + "' is not " +
                                                  enum_name_list<cluster::shutdown_policy>());
    c.on_shutdown = *policy;
  }
  if (!o.tls_cert.empty())
    f.tls.cert_file = o.tls_cert;
  if (!o.tls_key.empty())
    f.tls.key_file = o.tls_key;
  if (!o.tls_client_ca.empty())
    f.tls.client_ca_file = o.tls_client_ca;
  if (!o.dashboard.empty())
    f.dashboard.listen = o.dashboard == "off" ? "" : o.dashboard;
  return f;
}

// SIGINT and SIGTERM, blocked (taken by sigwait) before any thread starts.
sigset_t block_stop_signals() {
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  return stop; // (SIGPIPE is ignored in main)
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
               std::string{to_string(f->controller.on_shutdown)}.c_str());
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

// ---- a node agent ----

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

} // namespace troupe::apps
