#pragma once
// The controller's gRPC face: troupe.v1.JobService over a controller, plus
// the standard grpc.health.v1.Health service and server reflection.
//
// NOTE [api security]: secure by default (docs/control.md, "Security").
//   - It binds loopback unless told otherwise, and refuses any other
//     address without TLS (server certificate and key; a client CA turns on
//     mutual TLS).
//   - Every JobService call needs `authorization: Bearer <token>`; a missing
//     or wrong token gets UNAUTHENTICATED before anything is read or
//     changed (compared in constant time). Health answers without one.
//   - Mutating calls (the table in api_server.cpp) are written to the audit
//     log with who asked, what, when and the result — refused calls too.
//   - Sizes are bounded: messages (max_message_bytes), specs, overrides and
//     settings (controller_limits).

#include "cluster/controller.hpp"
#include "cluster/credentials.hpp"

#include <memory>
#include <string>
#include <string_view>

namespace troupe::cluster {

struct tls_options {
  /// PEM files; cert and key turn TLS on, client_ca makes it mutual.
  std::string cert_file;
  std::string key_file;
  std::string client_ca_file;
  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

struct api_options {
  /// host:port ("127.0.0.1:0" = an ephemeral port).
  std::string listen = "127.0.0.1:7450";
  tls_options tls;
  /// The bearer token every JobService call must carry.
  std::string token;
  /// The secret node agents join with (NodeService); "" = no NodeService.
  std::string cluster_secret;
  int64_t max_message_bytes = 4 << 20;
};

class api_server {
public:
  /// Listens (refusing a non-loopback address without TLS) and serves.
  static expected<std::unique_ptr<api_server>> start(controller& ctl, const api_options& o);
  ~api_server();

  /// The port it listens on (the chosen one for port 0).
  int port() const;
  /// Health: NOT_SERVING from now on (a shutdown begins).
  void set_not_serving();
  /// Stops the server: open calls get `deadline_s` to end, streams are ended.
  void shutdown(double deadline_s);

  struct impl;

private:
  api_server() = default;
  std::unique_ptr<impl> impl_;
};

} // namespace troupe::cluster
