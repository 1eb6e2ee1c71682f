#pragma once
// Hosts for tests: Linux network namespaces joined by a bridge, each with
// an address of its own (10.<net>.0.<i+1>/24). A process started "on" a
// host runs under `ip netns exec`, so it sees only that host's interfaces;
// a host that "disappears" has its link cut, with no reset sent to anyone.
// Needs root and iproute2; create() says why when it cannot be made, and
// the tests skip with that message. (No test framework here: the
// benchmarks use it too.)

#include "cluster/local_launcher.hpp"
#include "runtime/file_io.hpp"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace troupe::test {

/// Runs a tool to its end (bounded); false and its output in `why` when it
/// fails.
inline bool run_tool(const std::vector<std::string>& argv, int timeout_s, std::string& why) {
  static std::atomic<int> counter{0};
  auto out = (std::filesystem::temp_directory_path() /
              ("troupe-tool-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ".log"))
                 .string();
  cluster::process_spec spec;
  spec.name = argv.empty() ? std::string{"tool"} : argv.front();
  spec.argv = argv;
  spec.output_path = out;
  auto p = cluster::local_process::spawn(spec);
  if (!p) {
    why = describe(p.error());
    return false;
  }
  auto st = p->wait_for(timeout_s * 1000);
  auto text = runtime::read_file(out);
  std::error_code ec;
  std::filesystem::remove(out, ec);
  if (st && st->ok())
    return true;
  why = spec.name + " " + (st ? st->describe() : std::string{"did not finish"}) + ": " + (text ? *text : "");
  return false;
}

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
    return run_tool(args, 30, why);
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
  return run_tool({"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", dir + "/key.pem",
                   "-out", dir + "/cert.pem", "-days", "1", "-subj", "/CN=troupe-test", "-addext",
                   "subjectAltName=IP:" + ip_address},
                  60, why);
}

} // namespace troupe::test
