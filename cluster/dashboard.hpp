#pragma once
// The controller's web face (docs/dashboard.md): the live dashboard, its
// JSON API, the job's events as Server-Sent Events, and Prometheus'
// /metrics — all read from the same controller as the gRPC API.
//
// NOTE [dashboard security]: the rules of the gRPC API (NOTE [api
// security]) carried over to a browser.
//   - Loopback unless told otherwise; any other address needs TLS (the
//     controller's certificate and key).
//   - Logging in takes the controller's token (a form POST) and gives an
//     HttpOnly, SameSite=Strict session cookie (Secure under TLS); the
//     session has its own random CSRF token. Nothing but the login page and
//     the static files answers without a session (/metrics also takes the
//     token as `Authorization: Bearer`).
//   - Mutating calls are POSTs that carry the session's CSRF token in
//     `X-CSRF-Token` (a form field for logout), and whose Origin, when the
//     browser sends one, is the dashboard's own; anything else is refused
//     with 403 before anything changes. Every command is in the audit log.
//   - Server text reaches pages only as text (never as HTML); responses
//     carry a Content-Security-Policy with scripts from the dashboard only.
//   - Bodies, streams and sessions are bounded.

#include "cluster/api_server.hpp"
#include "cluster/controller.hpp"

#include <memory>
#include <string>

namespace troupe::cluster {

struct dashboard_options {
  /// host:port ("" = no dashboard; port 0 = an ephemeral one).
  std::string listen = "127.0.0.1:7451";
  /// The gRPC API's TLS pair (client CAs are not asked of browsers).
  tls_options tls;
  /// The controller's token: what logging in takes.
  std::string token;
  /// Open event streams at once (each holds a server thread).
  int64_t max_streams = 64;
  /// A session's lifetime.
  double session_hours = 12;
  /// Points per series a job page loads at first (older ones thinned).
  int64_t max_points = 2000;
};

class dashboard {
public:
  /// Listens (refusing a non-loopback address without TLS) and serves.
  static expected<std::unique_ptr<dashboard>> start(controller& ctl, const dashboard_options& o);
  ~dashboard();

  /// The port it listens on (the chosen one for port 0).
  int port() const;
  /// Ends open streams and stops listening. Idempotent.
  void stop();

  struct impl;

private:
  dashboard() = default;
  std::unique_ptr<impl> impl_;
};

} // namespace troupe::cluster
