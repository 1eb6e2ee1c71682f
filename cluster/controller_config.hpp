#pragma once
// The files that configure the control plane (docs/control.md):
// `troupe controller --config FILE` (controller_file) and the CLI client's
// ~/.config/troupe/client.yaml (client_file). Flags override both.

#include "cluster/api_server.hpp"
#include "cluster/controller.hpp"
#include "cluster/dashboard.hpp"
#include "runtime/config.hpp"

#include <string>

namespace troupe::cluster {

struct controller_file {
  std::string listen = "127.0.0.1:7450";
  /// The controller's settings (its executable is not read from the file;
  /// state_dir "" = the default, $XDG_STATE_HOME/troupe or
  /// ~/.local/state/troupe).
  controller_options controller;
  tls_options tls;
  int64_t max_message_bytes = 4 << 20;
  /// The web dashboard and /metrics (its tls and token are the API's).
  dashboard_options dashboard;
};

template <class V>
void visit(V& v, tls_options& c) {
  v.field("cert", c.cert_file, "PEM certificate of the server (with key: TLS on)");
  v.field("key", c.key_file, "PEM private key of the server");
  v.field("client_ca", c.client_ca_file, "PEM CA of client certificates (mutual TLS)");
}

template <class V>
void visit(V& v, controller_limits& c) {
  v.field("spec_bytes", c.spec_bytes, "Bytes of a spec with its base files");
  v.field("overrides", c.overrides, "--set overrides per submit");
  v.field("override_bytes", c.override_bytes, "Bytes of one override");
  v.field("settings", c.settings, "Settings per UpdateJob");
}

template <class V>
void visit(V& v, dashboard_options& c) {
  v.field("listen", c.listen, "host:port of the dashboard and /metrics; \"\" = none (non-loopback needs TLS)");
  v.field("max_streams", c.max_streams, "Live event streams open at once");
  v.field("session_hours", c.session_hours, "Lifetime of a login");
  v.field("max_points", c.max_points, "Points per series a job page loads at first");
}

template <class V>
void visit(V& v, node_options& c) {
  v.field("heartbeat_ms", c.heartbeat_ms, "How often node agents heartbeat");
  v.field("lost_after_ms", c.lost_after_ms, "Silence after which a node is lost");
}

template <class V>
void visit(V& v, controller_file& c) {
  auto& o = c.controller;
  v.field("listen", c.listen, "host:port of the API (non-loopback needs TLS)");
  v.field("state_dir", o.state_dir, "Records, token, audit log and jobs root");
  v.field("max_running_jobs", o.max_running_jobs, "Jobs running at once");
  v.field("cores", o.cores, "Cores handed out to jobs; 0 = this machine's");
  v.choice("on_shutdown", o.on_shutdown,
           "Running jobs at shutdown: cancel with a checkpoint, wait for them, or leave them");
  v.field("shutdown_timeout_s", o.shutdown_timeout_s, "Longest wait of a shutdown for its jobs");
  v.field("driver_start_timeout_s", o.driver_start_timeout_s, "Longest wait for a driver to start");
  v.field("command_timeout_s", o.command_timeout_s, "Longest wait for a job's answer to a command");
  v.section("tls", c.tls, "TLS of the API");
  v.section("limits", o.limits, "Size limits of requests");
  v.field("max_message_bytes", c.max_message_bytes, "Largest request message");
  v.section("dashboard", c.dashboard, "The web dashboard (docs/dashboard.md)");
  v.section("nodes", o.nodes, "Node agents (docs/cluster.md)");
  v.field("advertise", o.advertise,
          "The address nodes' workers reach this machine's job drivers at; \"\" = the API's listen "
          "host when it is an address, else this host's name");
}

void check(const controller_file& c, runtime::config_checks& checks);

struct client_file {
  std::string address;
  std::string token_file;
  std::string tls_ca;
  std::string tls_cert;
  std::string tls_key;
};

template <class V>
void visit(V& v, client_file& c) {
  v.field("address", c.address, "host:port of the controller");
  v.field("token_file", c.token_file, "File holding the API token");
  v.field("tls_ca", c.tls_ca, "PEM CA of the controller's certificate");
  v.field("tls_cert", c.tls_cert, "PEM client certificate (mutual TLS)");
  v.field("tls_key", c.tls_key, "PEM client key");
}

inline void check(const client_file&, runtime::config_checks&) {}

/// Where a running controller says it listens: <state dir>/controller.json.
inline constexpr const char* controller_info_file = "controller.json";
/// The API token in the state dir.
inline constexpr const char* token_file_name = "token";
/// The secret node agents join with, in the state dir.
inline constexpr const char* cluster_secret_file_name = "cluster_secret";

} // namespace troupe::cluster
