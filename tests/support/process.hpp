#pragma once
// Runs a shell command for CLI integration tests and returns its stdout.

#include <array>
#include <cstdio>
#include <string>

namespace troupe::test {

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

} // namespace troupe::test
