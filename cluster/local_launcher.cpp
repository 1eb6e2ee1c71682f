#include "cluster/local_launcher.hpp"

#include "runtime/file_io.hpp"

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstring>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string_view>
#include <thread>

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace troupe::cluster {

std::string exit_status::describe() const {
  if (signal != 0)
    return "killed by signal " + std::to_string(signal) + " (" + ::strsignal(signal) + ")";
  return "exited with status " + std::to_string(code);
}

local_process::local_process(local_process&& other) noexcept
  : pid_(other.pid_), name_(std::move(other.name_)), status_(other.status_) {
  other.pid_ = -1;
}

local_process& local_process::operator=(local_process&& other) noexcept {
  if (this != &other) {
    kill_and_reap();
    pid_ = other.pid_;
    name_ = std::move(other.name_);
    status_ = other.status_;
    other.pid_ = -1;
  }
  return *this;
}

local_process::~local_process() {
  kill_and_reap();
  pid_ = -1;
}

void local_process::kill_and_reap() {
  if (!running())
    return;
  ::kill(pid_, SIGKILL);
  int st = 0;
  while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
  }
}

namespace {

// PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, not
// its process: a child forked from a thread that ends early (a job's
// driver actor restarting a worker: NOTE [supervision]) would die with
// it. Every child is forked on this one thread, which lives as long as the
// process (never joined: it ends with the process).
class fork_thread {
public:
  static fork_thread& get() {
    static auto* t = new fork_thread();
    return *t;
  }

  template <class F>
  auto run(F f) -> decltype(f()) {
    std::packaged_task<decltype(f())()> task(std::move(f));
    auto done = task.get_future();
    {
      std::lock_guard lock{mu_};
      queue_.emplace_back([&task] { task(); });
    }
    cv_.notify_one();
    return done.get();
  }

private:
  fork_thread() {
    std::thread([this] {
      while (true) {
        std::function<void()> next;
        {
          std::unique_lock lock{mu_};
          cv_.wait(lock, [this] { return !queue_.empty(); });
          next = std::move(queue_.front());
          queue_.pop_front();
        }
        next();
      }
    }).detach();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
};

} // namespace

expected<local_process> local_process::spawn(const process_spec& spec) {
  return fork_thread::get().run([&spec] { return spawn_here(spec); });
}

expected<local_process> local_process::spawn_here(const process_spec& spec) {
  if (spec.argv.empty())
    return make_error(errc::invalid_argument, spec.name + ": empty argv");
  // Everything the child needs is prepared before fork: after it, only
  // async-signal-safe calls.
  std::vector<char*> argv;
  for (const auto& a : spec.argv)
    argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_storage;
  // The parent's variables but those the spec sets (a name's first entry
  // is the one getenv finds).
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view entry{*e};
    auto name = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& kv : spec.env)
      overridden = overridden || kv.first == name;
    if (!overridden)
      env_storage.emplace_back(entry);
  }
  for (const auto& [k, v] : spec.env)
    env_storage.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& e : env_storage)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  int out_fd = -1;
  if (!spec.output_path.empty()) {
    out_fd =
        ::open(spec.output_path.c_str(),
               O_WRONLY | O_CREAT | (spec.append_output ? O_APPEND : O_TRUNC) | O_CLOEXEC, 0644);
    if (out_fd < 0)
      return make_error(errc::io_error, spec.name + ": cannot open output file " +
                                          spec.output_path + ": " + std::strerror(errno));
  }
  // A pipe that closes on exec tells the parent whether exec succeeded.
  int exec_pipe[2];
  if (::pipe2(exec_pipe, O_CLOEXEC) != 0)
    return make_error(errc::io_error, spec.name + ": pipe failed: " + std::strerror(errno));
  const char* cwd = spec.cwd.empty() ? nullptr : spec.cwd.c_str();
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(exec_pipe[0]);
    ::close(exec_pipe[1]);
    if (out_fd >= 0)
      ::close(out_fd);
    return make_error(errc::io_error, spec.name + ": fork failed: " + std::strerror(errno));
  }
  if (pid == 0) {
    // A child starts with default signal handling: the mask and the ignored
    // dispositions survive exec, and a controller or node agent blocks
    // SIGINT / SIGTERM for its sigwait and ignores SIGPIPE — a driver or
    // worker inheriting that would never see a stop signal (NOTE [stop
    // signals] in apps/console.hpp).
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGINT, SIGTERM, SIGPIPE, SIGHUP, SIGQUIT})
      ::signal(sig, SIG_DFL);
    if (spec.detached) {
      ::setsid();
    } else {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent)
        ::_exit(127); // the parent died before prctl took effect
    }
    if (out_fd >= 0) {
      ::dup2(out_fd, STDOUT_FILENO);
      ::dup2(out_fd, STDERR_FILENO);
    }
    // The failing step (0: chdir, 1: exec) and its errno.
    int failure[2] = {0, 0};
    if (cwd == nullptr || ::chdir(cwd) == 0) {
      ::execve(argv[0], argv.data(), envp.data());
      failure[0] = 1;
    }
    failure[1] = errno;
    [[maybe_unused]] auto n = ::write(exec_pipe[1], failure, sizeof(failure));
    ::_exit(127);
  }
  ::close(exec_pipe[1]);
  if (out_fd >= 0)
    ::close(out_fd);
  int failure[2] = {0, 0};
  ssize_t n;
  do {
    n = ::read(exec_pipe[0], failure, sizeof(failure));
  } while (n < 0 && errno == EINTR);
  ::close(exec_pipe[0]);
  local_process proc;
  proc.pid_ = pid;
  proc.name_ = spec.name;
  if (n == static_cast<ssize_t>(sizeof(failure))) {
    proc.wait_for(5000);
    return make_error(errc::io_error, spec.name + (failure[0] == 0 ? ": cannot enter " + spec.cwd
                                                                   : ": cannot execute " + spec.argv[0]) +
                                        ": " + std::strerror(failure[1]));
  }
  return proc;
}

void local_process::release() {
  pid_ = -1;
  status_.reset();
}

std::optional<exit_status> local_process::poll() {
  if (status_ || pid_ <= 0)
    return status_;
  int st = 0;
  pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    exit_status s;
    if (WIFEXITED(st))
      s.code = WEXITSTATUS(st);
    else if (WIFSIGNALED(st))
      s.signal = WTERMSIG(st);
    status_ = s;
  }
  return status_;
}

expected<exit_status> local_process::wait_for(int64_t timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto pause = std::chrono::microseconds(200);
  for (;;) {
    if (auto s = poll())
      return *s;
    if (std::chrono::steady_clock::now() >= deadline)
      return make_error(errc::timeout, name_ + " (pid " + std::to_string(pid_) +
                                         ") still running after " + std::to_string(timeout_ms) +
                                         " ms");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
}

void local_process::kill(int signal) {
  if (running())
    ::kill(pid_, signal);
}

expected<void> wait_all(std::vector<local_process>& procs, int64_t timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto pause = std::chrono::microseconds(200);
  for (;;) {
    bool all_done = true;
    for (auto& p : procs) {
      auto s = p.poll();
      if (!s) {
        all_done = false;
        continue;
      }
      if (!s->ok()) {
        for (auto& other : procs)
          other.kill(SIGKILL);
        return make_error(errc::process_failed, p.name() + " " + s->describe());
      }
    }
    if (all_done)
      return caf::unit;
    if (std::chrono::steady_clock::now() >= deadline) {
      std::string names;
      for (auto& p : procs)
        if (p.running())
          names += (names.empty() ? "" : ", ") + p.name();
      for (auto& p : procs)
        p.kill(SIGKILL);
      return make_error(errc::timeout, "still running after " + std::to_string(timeout_ms) +
                                         " ms: " + names);
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
}

expected<std::string> self_executable() {
  std::string buf(4096, '\0');
  auto n = ::readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0)
    return make_error(errc::io_error, std::string{"cannot read /proc/self/exe: "} +
                                        std::strerror(errno));
  buf.resize(static_cast<size_t>(n));
  return buf;
}

std::string tail_of_file(const std::string& path, size_t max_bytes) {
  auto text = runtime::read_file(path);
  if (!text || text->empty())
    return {};
  auto start = text->size() > max_bytes ? text->size() - max_bytes : 0;
  auto out = text->substr(start);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r'))
    out.pop_back();
  return out;
}

} // namespace troupe::cluster
