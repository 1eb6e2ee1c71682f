#pragma once
// Hosts for tests: Linux network namespaces joined by a bridge, each with
// an address of its own (10.<net>.0.<i+1>/24). A process started "on" a
// host runs under `ip netns exec`, so it sees only that host's interfaces;
// a host that "disappears" has its link cut, with no reset sent to anyone.
// Needs root and iproute2; create() says why when it cannot be made, and
// the tests skip with that message.

#include "cluster/local_launcher.hpp"
#include "tests/cluster/control_harness.hpp"

#include <unistd.h>

#include <string>
#include <vector>

namespace troupe::test {

class netns_lab {
public:
  /// `hosts` namespaces on one bridge; null and `why` when they cannot be
  /// made here (not root, no `ip`, namespaces not allowed).
  static std::unique_ptr<netns_lab> create(int hosts, std::string& why) {
    if (::geteuid() != 0) {
      why = "network namespaces need root (run the tests as root to cover multi-host)";
      return nullptr;
    }
    if (::access(ip_tool, X_OK) != 0) {
      why = std::string{ip_tool} + " is missing (package iproute2)";
      return nullptr;
    }
    auto lab = std::unique_ptr<netns_lab>(new netns_lab);
    // Names unique per process: tests running in parallel do not meet.
    auto tag = "tr" + std::to_string(::getpid() % 100000);
    lab->net_ = 100 + static_cast<int>(::getpid() % 150);
    lab->hub_ = tag + "-hub";
    if (!lab->ip({"netns", "add", lab->hub_}, why))
      return nullptr;
    lab->made_.push_back(lab->hub_);
    if (!lab->ip({"-n", lab->hub_, "link", "add", "br0", "type", "bridge"}, why) ||
        !lab->ip({"-n", lab->hub_, "link", "set", "br0", "up"}, why))
      return nullptr;
    for (int i = 0; i < hosts; ++i) {
      auto name = tag + "-h" + std::to_string(i);
      if (!lab->ip({"netns", "add", name}, why))
        return nullptr;
      lab->made_.push_back(name);
      lab->hosts_.push_back(name);
      auto outer = "v" + std::to_string(i);
      auto address = lab->address(i) + "/24";
      if (!lab->ip({"-n", lab->hub_, "link", "add", outer, "type", "veth", "peer", "name", "eth0", "netns", name},
                   why) ||
          !lab->ip({"-n", lab->hub_, "link", "set", outer, "master", "br0", "up"}, why) ||
          !lab->ip({"-n", name, "addr", "add", address, "dev", "eth0"}, why) ||
          !lab->ip({"-n", name, "link", "set", "eth0", "up"}, why) ||
          !lab->ip({"-n", name, "link", "set", "lo", "up"}, why))
        return nullptr;
    }
    return lab;
  }

  ~netns_lab() {
    std::string why;
    for (auto it = made_.rbegin(); it != made_.rend(); ++it)
      ip({"netns", "del", *it}, why);
  }

  int hosts() const { return static_cast<int>(hosts_.size()); }
  const std::string& name(int host) const { return hosts_.at(host); }
  /// The host's address, 10.<net>.0.<host+1>.
  std::string address(int host) const {
    return "10." + std::to_string(net_) + ".0." + std::to_string(host + 1);
  }

  /// `argv` as run on `host`.
  std::vector<std::string> on(int host, const std::vector<std::string>& argv) const {
    std::vector<std::string> out{ip_tool, "netns", "exec", name(host)};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }

  /// Cuts the host off the network: its link goes down, and nothing tells
  /// its peers (as when a machine loses power).
  bool cut(int host) {
    std::string why;
    return ip({"-n", hub_, "link", "set", "v" + std::to_string(host), "down"}, why);
  }

private:
  static constexpr const char* ip_tool = "/usr/sbin/ip";
  netns_lab() = default;

  bool ip(std::vector<std::string> args, std::string& why) const {
    args.insert(args.begin(), ip_tool);
    auto r = run_process(args, 30);
    if (r.code != 0)
      why = "ip " + args.at(1) + " ...: " + r.err;
    return r.code == 0;
  }

  int net_ = 100;
  std::string hub_;
  std::vector<std::string> hosts_;
  std::vector<std::string> made_;
};

/// A self-signed certificate for `ip_address` (its own CA), made with the
/// openssl tool: files cert.pem and key.pem in `dir`. False and `why` when
/// it cannot be made.
inline bool make_test_certificate(const std::string& dir, const std::string& ip_address, std::string& why) {
  auto r = run_process({"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout",
                        dir + "/key.pem", "-out", dir + "/cert.pem", "-days", "1", "-subj", "/CN=troupe-test",
                        "-addext", "subjectAltName=IP:" + ip_address},
                       60);
  if (r.code != 0)
    why = "openssl req: " + r.err;
  return r.code == 0;
}

} // namespace troupe::test
