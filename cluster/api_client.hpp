#pragma once
// A client of the controller's job API (api_server.hpp) in troupe's plain
// structs: what the CLI (`troupe submit`, `jobs`, `status`, ...) and the
// tests use. Errors come back as troupe errors: the server's code, message
// and violations (grpc_status.hpp).

#include "cluster/controller.hpp"

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace grpc {
class Channel;
} // namespace grpc

namespace troupe::cluster {

struct client_options {
  /// host:port of the controller.
  std::string address;
  std::string token;
  /// TLS: the CA that signed the server's certificate ("" = plain text,
  /// loopback only), and the client's own pair for mutual TLS.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  /// Bound on each unary call (streams are unbounded).
  double timeout_s = 60;
  /// Sent as x-troupe-user (for the audit log).
  std::string user;
  /// Who the peer is and how its CA is given, for messages.
  std::string peer = "controller";
  std::string ca_hint = "--tls-ca";
};

/// A channel to the controller (o.peer) at `o.address`: TLS when a CA is given
/// (with the client's own pair for mutual TLS); clear text only to a
/// loopback address, so that no secret crosses a network unencrypted.
expected<std::shared_ptr<grpc::Channel>> open_channel(const client_options& o);

struct metric_point {
  std::string stage;
  int64_t step = 0;
  int64_t time_us = 0;
  actors::job::metric_map values;
};

struct log_entry {
  int64_t seq = 0;
  int64_t time_us = 0;
  std::string level;
  std::string text;
};

class api_client {
public:
  static expected<api_client> connect(const client_options& o);
  api_client(api_client&&) noexcept;
  api_client& operator=(api_client&&) noexcept;
  ~api_client();

  expected<job_view> submit(const submit_request& r);
  expected<std::vector<job_view>> list(const std::vector<ctl_state>& states = {}, int32_t limit = 0);
  expected<job_view> get(const std::string& id);
  expected<job_view> cancel(const std::string& id, bool now = false);
  expected<job_view> pause(const std::string& id);
  expected<job_view> resume(const std::string& id);
  expected<job_view> checkpoint(const std::string& id);
  expected<job_view> update(const std::string& id,
                            const std::vector<std::pair<std::string, std::string>>& settings);
  expected<std::vector<metric_point>> metrics(const std::string& id,
                                              const std::vector<std::string>& keys = {},
                                              const std::string& stage = {}, int64_t from_step = 0,
                                              int64_t to_step = 0);
  /// Streams the job's events from `from_seq` to `on_event` and answers the
  /// job in its final state.
  expected<job_view> watch(const std::string& id, int64_t from_seq,
                           const std::function<void(const actors::job::event&)>& on_event);
  /// The last `lines` log lines (0 = all), then new ones while `follow`.
  expected<void> logs(const std::string& id, int32_t lines, bool follow,
                      const std::function<void(const log_entry&)>& on_line);
  /// The node agents that joined, by name.
  expected<std::vector<node_view>> nodes();

private:
  api_client() = default;
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace troupe::cluster
