#pragma once
// Local child processes for workers and smoke tests: spawn with argv and
// environment, die with their parent (no orphans), bounded waits, and exit
// statuses that say which process ended how.

#include "runtime/error.hpp"

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace troupe::cluster {

struct process_spec {
  /// Human name used in errors ("gloo-smoke rank 1").
  std::string name;
  /// argv[0] is the executable path.
  std::vector<std::string> argv;
  /// Extra environment variables, added to the parent's (replacing those
  /// of the same name).
  std::vector<std::pair<std::string, std::string>> env;
  /// File receiving the child's stdout and stderr; empty = inherit.
  std::string output_path;
  /// Appended to (else truncated).
  bool append_output = false;
  /// Working directory of the child; empty = the parent's.
  std::string cwd;
  /// A session of its own, and no death with the parent: a job's driver
  /// outlives a controller that is restarted (NOTE [controller restart]).
  bool detached = false;
};

struct exit_status {
  /// Exit code when the process exited normally, else -1.
  int code = -1;
  /// Terminating signal, or 0.
  int signal = 0;
  bool ok() const { return signal == 0 && code == 0; }
  /// "exited with status 3" / "killed by signal 9 (Killed)".
  std::string describe() const;
};

/// One child process. Destroying a running one kills it (SIGKILL) and reaps
/// it (unless released). The child also receives SIGKILL if the parent dies
/// (PR_SET_PDEATHSIG), unless it is detached.
class local_process {
public:
  local_process() = default;
  local_process(const local_process&) = delete;
  local_process& operator=(const local_process&) = delete;
  local_process(local_process&& other) noexcept;
  local_process& operator=(local_process&& other) noexcept;
  ~local_process();

  /// Starts the process; fails with io_error when the executable cannot run.
  static expected<local_process> spawn(const process_spec& spec);

  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  bool running() const { return pid_ > 0 && !status_; }

  /// Non-blocking: the exit status if the process has ended.
  std::optional<exit_status> poll();
  /// Waits at most `timeout_ms`; timeout error naming the process otherwise.
  expected<exit_status> wait_for(int64_t timeout_ms);
  /// Sends `signal` to a running process.
  void kill(int signal);
  /// Lets the process go: not killed, waited for or reaped by this object.
  void release();

private:
  // SIGKILL and reap a process that still runs (members untouched).
  void kill_and_reap();
  // spawn's work, on the thread that forks every child.
  static expected<local_process> spawn_here(const process_spec& spec);

  pid_t pid_ = -1;
  std::string name_;
  std::optional<exit_status> status_;
};

/// Waits for all processes; returns the first failure as process_failed
/// ("<name> <describe()>"), killing the others, or a timeout naming those
/// still running.
expected<void> wait_all(std::vector<local_process>& procs, int64_t timeout_ms);

/// The last `max_bytes` of a process's output file, without its final line
/// breaks ("" when it cannot be read).
std::string tail_of_file(const std::string& path, size_t max_bytes);

/// Path of the running executable (/proc/self/exe).
expected<std::string> self_executable();

} // namespace troupe::cluster
