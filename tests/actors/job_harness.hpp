#pragma once
// A job actor under test: an actor system, the job, a subscriber that
// records every event, and commands with bounded waits.

#include "actors/actor_system.hpp"
#include "actors/rl/job.hpp"
#include "runtime/file_io.hpp"
#include "tests/actors/job_yaml.hpp"

#include <caf/all.hpp>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <vector>

namespace troupe::actors::rl::testing {

/// Events received by a subscriber actor, safe to read from the test thread.
class event_log {
public:
  void add(const job::event& e) {
    std::lock_guard lock{mu_};
    events_.push_back(e);
    cv_.notify_all();
  }
  std::vector<job::event> snapshot() const {
    std::lock_guard lock{mu_};
    return events_;
  }
  /// Waits (at most `limit`) until an event satisfies `pred`; true if one did.
  bool wait_for(const std::function<bool(const job::event&)>& pred,
                std::chrono::seconds limit = std::chrono::seconds(120)) {
    std::unique_lock lock{mu_};
    return cv_.wait_for(lock, limit,
                        [&] { return std::any_of(events_.begin(), events_.end(), pred); });
  }
  bool wait_for_state(job::job_state s, std::chrono::seconds limit = std::chrono::seconds(120)) {
    return wait_for(
        [s](const job::event& e) {
          auto* c = std::get_if<job::state_changed>(&e.body);
          return c && c->to == s;
        },
        limit);
  }
  /// Waits (at most `limit`) until `n` events satisfy `pred`.
  bool wait_for_count(const std::function<bool(const job::event&)>& pred, size_t n,
                      std::chrono::seconds limit = std::chrono::seconds(120)) {
    std::unique_lock lock{mu_};
    return cv_.wait_for(lock, limit, [&] {
      return static_cast<size_t>(std::count_if(events_.begin(), events_.end(), pred)) >= n;
    });
  }
  /// The number of events that satisfy `pred`.
  size_t count(const std::function<bool(const job::event&)>& pred) const {
    std::lock_guard lock{mu_};
    return static_cast<size_t>(std::count_if(events_.begin(), events_.end(), pred));
  }

private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<job::event> events_;
};

inline caf::behavior recorder(caf::event_based_actor*, std::shared_ptr<event_log> log) {
  return {[log](const job::event& e) { log->add(e); }};
}

class job_harness {
public:
  job_harness() : sys_((actors::configure(sys_cfg_), sys_cfg_)) {}
  ~job_harness() {
    if (job_)
      caf::anon_send_exit(*job_, caf::exit_reason::user_shutdown);
  }

  /// Spawns the job and subscribes a recorder from seq 1 (not started).
  expected<void> spawn(const job_config& cfg, run_options opts = {}) {
    cfg_ = cfg;
    auto j = spawn_rl_job(sys_, cfg, opts);
    if (!j)
      return j.error();
    job_ = j->actor;
    result_ = j->result;
    auto rec = sys_.spawn(recorder, events);
    auto next = subscribe(rec, 1);
    if (!next)
      return next.error();
    return {};
  }

  expected<int64_t> subscribe(const caf::actor& who, int64_t from) {
    caf::scoped_actor self{sys_};
    expected<int64_t> out = make_error(errc::internal, "no reply");
    self->request(*job_, std::chrono::seconds(30), job::subscribe_atom::value, who, from)
        .receive([&](int64_t n) { out = n; }, [&](caf::error& e) { out = std::move(e); });
    return out;
  }

  /// Sends a command and waits for the job actor's answer.
  template <class... Ts>
  expected<job::job_status> ask(Ts... xs) {
    caf::scoped_actor self{sys_};
    expected<job::job_status> out = make_error(errc::internal, "no reply");
    self->request(*job_, std::chrono::seconds(30), xs...)
        .receive([&](job::job_status& s) { out = std::move(s); },
                 [&](caf::error& e) { out = std::move(e); });
    return out;
  }

  /// Spawns, starts and waits for the final state.
  expected<job::job_status> run(const job_config& cfg, run_options opts = {}) {
    if (auto ok = spawn(cfg, std::move(opts)); !ok)
      return ok.error();
    if (auto st = ask(job::start_atom::value); !st)
      return st.error();
    return await();
  }

  /// Waits (bounded) for the final state.
  expected<job::job_status> await(std::chrono::seconds limit = std::chrono::seconds(300)) {
    caf::scoped_actor self{sys_};
    expected<job::job_status> out = make_error(errc::timeout, "job did not end");
    self->request(*job_, limit, job::await_atom::value)
        .receive([&](job::job_status& s) { out = std::move(s); },
                 [&](caf::error& e) { out = std::move(e); });
    return out;
  }

  /// metrics.jsonl as JSON objects.
  std::vector<nlohmann::json> metrics() const { return jsonl(cfg_.run.dir + "/metrics.jsonl"); }
  std::vector<nlohmann::json> journal() const { return jsonl(cfg_.run.dir + "/events.jsonl"); }

  static std::vector<nlohmann::json> jsonl(const std::string& path) {
    std::vector<nlohmann::json> out;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line))
      out.push_back(nlohmann::json::parse(line));
    return out;
  }

  caf::actor_system& system() { return sys_; }
  const rl_job::outcome& result() const { return *result_; }

  std::shared_ptr<event_log> events = std::make_shared<event_log>();

private:
  caf::actor_system_config sys_cfg_;
  caf::actor_system sys_;
  job_config cfg_;
  std::optional<job::job_actor> job_;
  std::shared_ptr<rl_job::outcome> result_;
};

/// The "rl" lines of a metrics file without the wall-clock metrics.
inline std::vector<nlohmann::json> deterministic_rl(const std::vector<nlohmann::json>& all) {
  std::vector<nlohmann::json> out;
  for (const auto& j : all)
    if (j["stage"] == "rl")
      out.push_back(deterministic_part(j));
  return out;
}

} // namespace troupe::actors::rl::testing
