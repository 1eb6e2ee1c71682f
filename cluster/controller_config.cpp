#include "cluster/controller_config.hpp"

namespace troupe::cluster {

void check(const controller_file& f, runtime::config_checks& checks) {
  const auto& c = f.controller;
  checks.require(c.max_running_jobs >= 1, "max_running_jobs", "must be at least 1");
  checks.require(c.cores >= 0, "cores", "must be 0 (this machine's) or more");
  checks.require(c.shutdown_timeout_s > 0, "shutdown_timeout_s", "must be positive");
  checks.require(c.driver_start_timeout_s > 0, "driver_start_timeout_s", "must be positive");
  checks.require(c.command_timeout_s > 0, "command_timeout_s", "must be positive");
  checks.require(c.limits.spec_bytes > 0, "limits.spec_bytes", "must be positive");
  checks.require(c.limits.overrides >= 0, "limits.overrides", "must not be negative");
  checks.require(c.limits.override_bytes > 0, "limits.override_bytes", "must be positive");
  checks.require(c.limits.settings > 0, "limits.settings", "must be positive");
  checks.require(f.max_message_bytes >= 4096 && f.max_message_bytes <= (1LL << 30),
                 "max_message_bytes", "must lie in [4096, 1 GiB]");
  checks.require(f.tls.cert_file.empty() == f.tls.key_file.empty(), "tls",
                 "give both cert and key, or neither");
  checks.require(f.tls.client_ca_file.empty() || !f.tls.cert_file.empty(), "tls.client_ca",
                 "mutual TLS needs the server's cert and key too");
  checks.require(c.nodes.heartbeat_ms >= 10 && c.nodes.heartbeat_ms <= 60000, "nodes.heartbeat_ms",
                 "must lie in [10, 60000]");
  checks.require(c.nodes.lost_after_ms >= 2 * c.nodes.heartbeat_ms && c.nodes.lost_after_ms <= 600000,
                 "nodes.lost_after_ms", "must be at least twice heartbeat_ms, and at most 600000");
  const auto& d = f.dashboard;
  if (!d.listen.empty()) {
    auto a = parse_listen_address(d.listen);
    checks.require(static_cast<bool>(a), "dashboard.listen", a ? "" : describe(a.error()));
  }
  checks.require(d.max_streams >= 1 && d.max_streams <= 1024, "dashboard.max_streams", "must lie in [1, 1024]");
  checks.require(d.session_hours > 0 && d.session_hours <= 24 * 30, "dashboard.session_hours",
                 "must lie in (0, 720]");
  checks.require(d.max_points >= 4 && d.max_points <= 100000, "dashboard.max_points", "must lie in [4, 100000]");
}

} // namespace troupe::cluster
