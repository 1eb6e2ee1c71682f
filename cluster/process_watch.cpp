#include "cluster/process_watch.hpp"

#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace troupe::cluster {

namespace {

int pidfd_of(int64_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
}

} // namespace

process_watch::process_watch(std::function<void()> on_news) : on_news_(std::move(on_news)) {
  inotify_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  wake_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  thread_ = std::thread{[this] { loop(); }};
}

process_watch::~process_watch() {
  {
    std::lock_guard lock{mu_};
    stop_ = true;
  }
  poke();
  thread_.join();
  for (auto& [pid, fd] : pids_)
    if (fd >= 0)
      ::close(fd);
  if (inotify_ >= 0)
    ::close(inotify_);
  if (wake_ >= 0)
    ::close(wake_);
}

void process_watch::poke() {
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_, &one, sizeof one);
}

expected<void> process_watch::watch_process(int64_t pid) {
  int fd = pidfd_of(pid);
  if (fd < 0) {
    if (errno == ESRCH) { // already gone: the thread tells
      {
        std::lock_guard lock{mu_};
        news_ = true;
      }
      poke();
      return {};
    }
    return make_error(errc::io_error, "pidfd_open " + std::to_string(pid) + ": " + std::strerror(errno));
  }
  {
    std::lock_guard lock{mu_};
    auto [it, added] = pids_.emplace(pid, fd);
    if (!added) {
      ::close(fd);
      return {};
    }
  }
  poke();
  return {};
}

void process_watch::forget_process(int64_t pid) {
  std::lock_guard lock{mu_};
  auto it = pids_.find(pid);
  if (it == pids_.end())
    return;
  if (it->second >= 0)
    ::close(it->second);
  pids_.erase(it);
  poke();
}

expected<void> process_watch::watch_folder(const std::string& dir) {
  std::lock_guard lock{mu_};
  if (folders_.count(dir))
    return {};
  int wd = ::inotify_add_watch(inotify_, dir.c_str(), IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE);
  if (wd < 0)
    return make_error(errc::io_error, "inotify " + dir + ": " + std::strerror(errno));
  folders_[dir] = wd;
  return {};
}

void process_watch::forget_folder(const std::string& dir) {
  std::lock_guard lock{mu_};
  auto it = folders_.find(dir);
  if (it == folders_.end())
    return;
  // Another folder may share the watch (the same inode): drop it only
  // when none does.
  int wd = it->second;
  folders_.erase(it);
  for (const auto& [d, w] : folders_)
    if (w == wd)
      return;
  ::inotify_rm_watch(inotify_, wd);
}

void process_watch::loop() {
  std::vector<pollfd> fds;
  std::vector<int64_t> owners; // the pid of fds[i], for i >= 2
  for (;;) {
    {
      std::lock_guard lock{mu_};
      if (stop_)
        return;
      fds.assign({{wake_, POLLIN, 0}, {inotify_, POLLIN, 0}});
      owners.assign(2, 0);
      for (const auto& [pid, fd] : pids_)
        if (fd >= 0)
          fds.push_back({fd, POLLIN, 0}), owners.push_back(pid);
    }
    if (::poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR)
        continue;
      return;
    }
    bool news = false;
    if (fds[0].revents) {
      uint64_t n;
      [[maybe_unused]] auto r = ::read(wake_, &n, sizeof n);
    }
    if (fds[1].revents) {
      alignas(inotify_event) char buf[4096];
      while (::read(inotify_, buf, sizeof buf) > 0)
        news = true;
    }
    {
      std::lock_guard lock{mu_};
      news = std::exchange(news_, false) || news;
      for (size_t i = 2; i < fds.size(); ++i) {
        if (!fds[i].revents)
          continue;
        auto it = pids_.find(owners[i]);
        if (it != pids_.end() && it->second == fds[i].fd) {
          ::close(it->second);
          it->second = -1; // fired; the owner forgets it
        }
        news = true;
      }
    }
    if (news)
      on_news_();
  }
}

} // namespace troupe::cluster
