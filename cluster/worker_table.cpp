#include "cluster/worker_table.hpp"

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <utility>

namespace troupe::cluster {

namespace fs = std::filesystem;

worker_table::worker_table(std::string executable, std::string work_dir, int64_t retire_grace_ms)
    : exe_(std::move(executable)), dir_(std::move(work_dir)), retire_grace_ms_(retire_grace_ms) {}

worker_table::~worker_table() {
  stop_all("the agent ended");
}

std::optional<worker_exit> worker_table::start(const worker_start& s) {
  auto refuse = [&](const std::string& why) {
    return worker_exit{s.job_id, s.rank, 0, -1, 0, "could not start: " + why, ""};
  };
  if (auto ok = check_worker_start(s); !ok)
    return refuse(describe(ok.error()));
  std::error_code ec;
  if (!fs::is_directory(s.cwd, ec))
    return refuse(
        "the job's directory " + s.cwd +
        " does not exist on this node (nodes need the job's files at the same path: a shared "
        "filesystem)");
  if (auto stuck = retire_previous(s))
    return refuse(*stuck);
  std::lock_guard lock{mu_};
  auto log_dir = fs::path{dir_} / "jobs" / s.job_id;
  fs::create_directories(log_dir, ec);
  process_spec spec;
  spec.name = "worker " + std::to_string(s.rank) + " of job " + s.job_id;
  spec.argv = worker_argv(exe_, s);
  spec.cwd = s.cwd;
  spec.output_path = (log_dir / ("worker-" + std::to_string(s.rank) + ".log")).string();
  auto p = local_process::spawn(spec);
  if (!p)
    return refuse(describe(p.error()));
  std::fprintf(stderr, "troupe node: started worker %d of job %s (pid %d, output %s)\n", s.rank,
               s.job_id.c_str(), static_cast<int>(p->pid()), spec.output_path.c_str());
  running_.push_back({s, std::move(*p), spec.output_path});
  return std::nullopt;
}

// A start for a worker that still runs here is its replacement (NOTE
// [replacing a worker] in job_nodes.hpp): the driver has told the old
// process to end, and on a loaded node it may not have yet. It gets the
// grace to end by itself, then is killed; its exit is reported with the
// others' (with its pid, so the controller only logs it). Without the
// table's lock while it waits: the writer's reaps and heartbeats go on.
// What it answers: why the new one cannot start (none: nullopt).
std::optional<std::string> worker_table::retire_previous(const worker_start& s) {
  std::optional<running> old;
  {
    std::lock_guard lock{mu_};
    // (One that ended, not reaped yet, is left for reap() to report.)
    auto it = std::find_if(running_.begin(), running_.end(), [&](running& r) {
      return r.start.job_id == s.job_id && r.start.rank == s.rank && !r.proc.poll();
    });
    if (it == running_.end())
      return std::nullopt;
    old = std::move(*it);
    running_.erase(it);
  }
  auto st = old->proc.wait_for(retire_grace_ms_);
  if (!st) {
    old->proc.kill(SIGKILL);
    st = old->proc.wait_for(5000);
  }
  std::fprintf(stderr, "troupe node: worker %d of job %s (pid %d) replaced: %s\n", s.rank,
               s.job_id.c_str(), static_cast<int>(old->proc.pid()),
               st ? st->describe().c_str() : "not reaped");
  std::lock_guard lock{mu_};
  if (!st) {
    auto why = "worker " + std::to_string(s.rank) + " of job " + s.job_id + " still runs (pid " +
               std::to_string(old->proc.pid()) + ") and could not be ended";
    running_.push_back(std::move(*old));
    return why;
  }
  retired_.push_back(exit_of(*old, *st));
  return std::nullopt;
}

std::vector<worker_exit> worker_table::reap() {
  std::lock_guard lock{mu_};
  std::vector<worker_exit> out = std::exchange(retired_, {});
  for (auto it = running_.begin(); it != running_.end();) {
    if (auto st = it->proc.poll()) {
      std::fprintf(stderr, "troupe node: worker %d of job %s %s\n", it->start.rank,
                   it->start.job_id.c_str(), st->describe().c_str());
      out.push_back(exit_of(*it, *st));
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<worker_exit> worker_table::stop(const std::string& job_id, const std::string& reason) {
  std::lock_guard lock{mu_};
  std::vector<worker_exit> out;
  for (auto it = running_.begin(); it != running_.end();) {
    if (!job_id.empty() && it->start.job_id != job_id) {
      ++it;
      continue;
    }
    if (it->proc.running())
      it->proc.kill(SIGKILL);
    auto st = it->proc.wait_for(5000);
    std::fprintf(stderr, "troupe node: worker %d of job %s %s (%s)\n", it->start.rank,
                 it->start.job_id.c_str(), st ? st->describe().c_str() : "not reaped",
                 reason.c_str());
    out.push_back(st ? exit_of(*it, *st)
                     : worker_exit{it->start.job_id, it->start.rank, it->proc.pid(), -1, 0,
                                   "not reaped", ""});
    it = running_.erase(it);
  }
  return out;
}

worker_exit worker_table::exit_of(const running& r, const exit_status& st) {
  return {r.start.job_id,          r.start.rank, r.proc.pid(), st.code, st.signal, st.describe(),
          tail_of_file(r.log, 600)};
}

} // namespace troupe::cluster
