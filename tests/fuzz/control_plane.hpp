#pragma once
// The controller's network faces as the fuzz targets of the gRPC and HTTP
// handlers reach them (NOTE [fuzz targets]): one real controller per
// process (its own state folder, jobs' drivers /bin/false), its gRPC API
// with NodeService, and its dashboard, on ephemeral loopback ports; a
// client over loopback; a logged-in dashboard session. Torn down at exit.
#include "cluster/api_client.hpp"
#include "cluster/api_server.hpp"
#include "cluster/controller.hpp"
#include "cluster/dashboard.hpp"
#include "cluster/workers.hpp"

#include <caf/all.hpp>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include <unistd.h>

namespace troupe::fuzz {

struct control_plane {
  std::filesystem::path dir;
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<cluster::controller> ctl;
  std::unique_ptr<cluster::api_server> api;
  std::unique_ptr<cluster::dashboard> web;
  const std::string token = "fuzz-api-token-0123456789abcdef";
  const std::string secret = "fuzz-cluster-secret-0123456789ab";
  std::string session; ///< the dashboard session's id ("" until logged in)
  std::string csrf;    ///< its CSRF token

  /// The one of this process, started on first use (a failed start ends the
  /// process: no input can be tried without it).
  static control_plane& get() {
    static control_plane* p = [] {
      auto* cp = new control_plane;
      if (!cp->start())
        std::abort();
      std::atexit([] { get().stop(); });
      return cp;
    }();
    return *p;
  }

private:
  bool start() {
    const char* tmp = std::getenv("TMPDIR");
    dir = std::filesystem::path{tmp && *tmp ? tmp : "/tmp"} /
          ("troupe-fuzz-control-" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    cluster::configure_network(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
    cluster::controller_options o;
    o.state_dir = (dir / "state").string();
    o.executable = "/bin/false";
    o.shutdown_timeout_s = 5;
    auto c = cluster::controller::open(*sys, o);
    if (!c)
      return false;
    ctl = std::move(*c);
    cluster::api_options a;
    a.listen = "127.0.0.1:0";
    a.token = token;
    a.cluster_secret = secret;
    auto s = cluster::api_server::start(*ctl, a);
    if (!s)
      return false;
    api = std::move(*s);
    cluster::dashboard_options d;
    d.listen = "127.0.0.1:0";
    d.token = token;
    auto w = cluster::dashboard::start(*ctl, d);
    if (!w)
      return false;
    web = std::move(*w);
    return true;
  }

  void stop() {
    if (web)
      web->stop();
    if (api)
      api->shutdown(1);
    if (ctl)
      ctl->shutdown();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

} // namespace troupe::fuzz
