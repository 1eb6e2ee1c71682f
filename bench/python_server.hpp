#pragma once
// A Python reference service of examples/python/ for the benches: started
// on an ephemeral loopback port (its stdout to /dev/null), killed at the end.

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace troupe::bench {

struct python_server {
  pid_t pid = -1;
  std::string address;
  python_server() = default;
  python_server(const python_server&) = delete;
  python_server& operator=(const python_server&) = delete;
  ~python_server() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  }

  /// examples/python/<script> --port 0 --port-file F <flags>; false when it
  /// did not serve within 30 s.
  bool start(const std::string& script, const std::string& port_file,
             const std::vector<std::string>& flags) {
    std::fflush(stdout); // else the child's stdout would write it again
    pid = ::fork();
    if (pid == 0) {
      if (!std::freopen("/dev/null", "w", stdout))
        ::_exit(127);
      std::vector<std::string> args{
          "python3",     std::string{TROUPE_SOURCE_DIR} + "/examples/python/" + script,
          "--port",      "0",
          "--port-file", port_file};
      args.insert(args.end(), flags.begin(), flags.end());
      std::vector<char*> argv;
      for (auto& a : args)
        argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv("/usr/bin/python3", argv.data());
      ::_exit(127);
    }
    for (int i = 0; i < 3000; ++i) {
      std::ifstream f(port_file);
      std::string port;
      if (f >> port) {
        address = "127.0.0.1:" + port;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
};

} // namespace troupe::bench
