#pragma once
// Wakes its owner when a watched process ends or a file lands in a watched
// folder, so a supervisor can sleep until something happens instead of
// polling (NOTE [supervision by events] in controller_impl.hpp).
//
// One thread polls a pidfd per process (Linux 5.3+: readable once the
// process has ended, child or not, and never confused with a later process
// of the same pid) and one inotify descriptor for the folders (a file
// created, written and closed, or renamed into one — write_file_atomic's
// rename). It calls `on_news` from its own thread only (never from a call
// of the owner's, which may hold the lock on_news takes) and with no lock
// of its own held; what changed is for the owner to look at.

#include "runtime/error.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace troupe::cluster {

class process_watch {
public:
  explicit process_watch(std::function<void()> on_news);
  ~process_watch();
  process_watch(const process_watch&) = delete;
  process_watch& operator=(const process_watch&) = delete;

  /// Calls on_news once `pid` has ended (at once when it has already).
  expected<void> watch_process(int64_t pid);
  void forget_process(int64_t pid);
  /// Calls on_news whenever a file appears in `dir` (created or renamed in).
  expected<void> watch_folder(const std::string& dir);
  void forget_folder(const std::string& dir);

private:
  void loop();
  void poke();
  std::function<void()> on_news_;
  std::mutex mu_;
  std::map<int64_t, int> pids_;         // pid -> pidfd (-1 once it fired)
  std::map<std::string, int> folders_;  // dir -> inotify watch
  int inotify_ = -1;
  int wake_ = -1; // eventfd: the set changed, or stop
  bool stop_ = false;
  bool news_ = false; // news found outside the thread (a pid already gone)
  std::thread thread_;
};

} // namespace troupe::cluster
