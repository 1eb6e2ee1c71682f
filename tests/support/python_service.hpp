#pragma once
// A Python reference service of examples/python/ (a reward server, an
// environment server) as a real process on an ephemeral loopback port.

#include "tests/support/process.hpp"
#include "tests/support/temp_dir.hpp"

#include <chrono>
#include <csignal>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace troupe::test {

/// Why the Python services cannot run here ("" when they can).
inline std::string python_grpc_missing() {
  int status = 0;
  run_command("/usr/bin/python3 -c 'import grpc, grpc_tools' > /dev/null 2>&1", status);
  return status == 0 ? ""
                     : "/usr/bin/python3 lacks grpc (install python3-grpcio, python3-grpc-tools)";
}

/// examples/python/<script> started with `--port 0 --port-file F` and
/// `flags`, stopped (SIGKILL) at the end.
class python_service {
public:
  python_service(const temp_dir& dir, const std::string& script, std::vector<std::string> flags) {
    port_file_ = dir.file(script + "-port-" + std::to_string(counter_++));
    std::vector<std::string> args{std::string{TROUPE_SOURCE_DIR} + "/examples/python/" + script,
                                  "--port", "0", "--port-file", port_file_};
    args.insert(args.end(), flags.begin(), flags.end());
    log_ = port_file_ + ".log";
    pid_ = start_process("/usr/bin/python3", args, log_);
  }
  ~python_service() { kill(); }
  python_service(const python_service&) = delete;
  python_service& operator=(const python_service&) = delete;

  /// host:port once it serves (bounded wait), or "" with the log in `why`.
  std::string address(std::string& why) {
    for (int i = 0; i < 3000; ++i) {
      std::ifstream f(port_file_);
      std::string port;
      if (f >> port)
        return "127.0.0.1:" + port;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    why = "the service did not start in 30 s: " + log();
    return "";
  }

  std::string log() const {
    std::ifstream f(log_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

  void kill() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      wait_exit(pid_, std::chrono::seconds(10));
      pid_ = -1;
    }
  }

private:
  static inline int counter_ = 0;
  std::string port_file_, log_;
  pid_t pid_ = -1;
};

} // namespace troupe::test
