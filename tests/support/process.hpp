#pragma once
// Runs a shell command for CLI integration tests and returns its stdout;
// starts a process in the background and waits for it with a bound.

#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace troupe::test {

/// Whether `pid` has ended: gone, or a zombie not yet reaped.
inline bool process_ended(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat))
    return true;
  auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'Z';
}

/// Runs `cmd` through the shell; `status` receives pclose's status.
inline std::string run_command(const std::string& cmd, int& status) {
  std::string out;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    status = -1;
    return out;
  }
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0)
    out.append(buf.data(), n);
  status = ::pclose(pipe);
  return out;
}

/// Starts `binary` with `args` (no shell), stdout and stderr to `output`.
inline pid_t start_process(const std::string& binary, const std::vector<std::string>& args,
                           const std::string& output = "/dev/null") {
  std::vector<std::string> copy{binary};
  copy.insert(copy.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : copy)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    if (std::freopen(output.c_str(), "w", stderr))
      ::dup2(STDERR_FILENO, STDOUT_FILENO);
    ::execv(binary.c_str(), argv.data());
    ::_exit(127);
  }
  return pid;
}

/// The wait status of `pid` once it ends, or nullopt when it runs past
/// `limit` (it is then killed and reaped).
inline std::optional<int> wait_exit(pid_t pid, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(pid, &status, WNOHANG) == pid)
      return status;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, &status, 0);
  return std::nullopt;
}

} // namespace troupe::test
