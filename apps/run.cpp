#include "apps/run.hpp"

#include "actors/actor_system.hpp"
#include "actors/rl/job.hpp"
#include "actors/rl/placement.hpp"
#include "cluster/driver_link.hpp"
#include "cluster/remote_reward.hpp"
#include "cluster/role_host.hpp"

#include "apps/console.hpp"
#include "cluster/controller.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <unistd.h>

namespace troupe::apps {

int config_show_command(const std::string& path, const std::vector<std::string>& overrides,
                        bool comments) {
  // What the file says, checked as a file (not against this machine: an
  // empty file shows the defaults).
  auto cfg = runtime::load_config_file<actors::rl::job_config>(path, overrides);
  if (!cfg) {
    std::fprintf(stderr, "troupe config show: %s\n", describe(cfg.error()).c_str());
    return 1;
  }
  std::cout << runtime::to_yaml(*cfg, comments);
  return 0;
}

int plan_command(const std::string& path, const std::vector<std::string>& overrides, bool suggest) {
  auto cfg = actors::rl::load_job(path, overrides);
  if (!cfg) {
    std::fprintf(stderr, "troupe plan: %s\n", describe(cfg.error()).c_str());
    return 1;
  }
  auto plan = actors::rl::make_plan(*cfg);
  if (suggest) // also when the job as given does not fit: what would
    std::cout << actors::rl::render_suggestions(actors::rl::suggest_strategies(*cfg));
  std::cout << actors::rl::render_layouts(actors::rl::suggest_layouts(*cfg));
  if (!plan) {
    std::fprintf(stderr, "troupe plan: %s\n", describe(plan.error()).c_str());
    return 1;
  }
  std::cout << plan->render();
  return 0;
}

namespace {

// NOTE [stop signals]: after SIGINT the current request may run to its
// timeout and the checkpoint then takes up to its own.
stop_bounds stop_bounds_of(const actors::rl::job_config& cfg) {
  const auto& t = cfg.run.timeouts;
  return {stop_bounds{}.now_s, std::max({t.compute_s, t.generate_s, t.weights_s}) + t.state_s + 10};
}

} // namespace

int run_job_command(const run_command_options& o) {
  auto cfg = actors::rl::load_job(o.config_path, o.overrides);
  if (!cfg) {
    std::fprintf(stderr, "troupe run: %s\n", describe(cfg.error()).c_str());
    return 1;
  }
  console_view view{cfg->run.progress};
  expected<actors::rl::job_summary> summary = make_error(errc::internal, "not run");
  // The watcher outlives the actor system: its bound holds while the
  // system's end waits for the driver and the roles.
  signal_watcher signals{stop_bounds_of(*cfg)};
  {
    caf::actor_system_config sys_cfg;
    actors::configure(sys_cfg);
    cluster::configure_network(sys_cfg);
    caf::actor_system sys{sys_cfg};
    // load and validate → spawn the job actor → subscribe the console →
    // start → wait for a final state (run_job).
    std::optional<caf::actor> console;
    actors::rl::run_options ro;
    ro.resume = o.resume;
    ro.factories = cluster::process_factories();
    ro.on_spawn = [&](const actors::job::job_actor& job) {
      auto c = spawn_console(sys, &view, job);
      caf::scoped_actor self{sys};
      self->request(job, std::chrono::seconds(10), actors::job::subscribe_atom::value, c,
                    int64_t{1})
        .receive([&](int64_t) { console = c; },
                 [&](caf::error&) { self->send_exit(c, caf::exit_reason::user_shutdown); });
      signals.watch(job);
    };
    cluster::launch_options lo;
    lo.timeout_ms = static_cast<int64_t>(cfg->run.timeouts.compute_s * 1000);
    summary = cluster::run_placed_job(sys, *cfg, ro, lo);
    signals.forget();
    if (console) {
      caf::scoped_actor self{sys};
      self->wait_for(*console); // the last lines are printed
    }
  }
  if (!summary) {
    view.end_line();
    std::fprintf(stderr, "troupe run: %s\n", describe(summary.error()).c_str());
    return 1;
  }
  std::fprintf(stderr, "\nrun %s: %s\n", cfg->run.name.c_str(), summary->run_dir.c_str());
  for (const auto& s : summary->stages) {
    std::fprintf(stderr, "  %-3s %s %lld steps", s.stage.c_str(),
                 s.skipped ? "(done earlier)" : (s.stopped ? "stopped after" : "finished,"),
                 static_cast<long long>(s.steps));
    if (!s.skipped)
      std::fprintf(stderr, " in %s", duration(s.seconds).c_str());
    for (const char* key : {"val/score/mean", "val/accuracy", "rm/eval_accuracy"}) {
      auto it = s.metrics.find(key);
      if (it != s.metrics.end())
        std::fprintf(stderr, "  %s %.3f", key, it->second);
    }
    if (!s.output.empty() && !s.stopped)
      std::fprintf(stderr, "  → %s", s.output.c_str());
    std::fputc('\n', stderr);
  }
  if (summary->stopped) {
    std::fprintf(stderr, signal_watcher::stopped_now()
                           ? "cancelled --now: no checkpoint; --resume continues from the last one\n"
                           : "stopped: checkpoint written; continue with --resume\n");
    return signal_watcher::exit_status();
  }
  return 0;
}

namespace {

// NOTE [driver link] (cluster/driver_link.hpp) and NOTE [controller
// restart]: the driver's front on a loopback port, and driver.json saying
// where, before anything else, so the controller can attach at once.
expected<caf::actor> publish_front(caf::actor_system& sys, const std::string& job_dir) {
  auto front = cluster::spawn_driver_front(sys);
  auto port = sys.middleman().publish(front, 0, "127.0.0.1");
  if (!port)
    return port.error();
  cluster::driver_info info{static_cast<int64_t>(::getpid()), *port};
  if (auto ok = cluster::write_driver_info(job_dir, info); !ok)
    return ok.error();
  return front;
}

} // namespace

int driver_command(const std::string& job_dir, bool resume, bool on_nodes) {
  auto spec = (std::filesystem::path{job_dir} / cluster::driver_spec_file).string();
  auto cfg = actors::rl::load_job(spec, {});
  if (!cfg) {
    std::fprintf(stderr, "troupe driver: %s\n", describe(cfg.error()).c_str());
    return 1;
  }
  cluster::launch_options lo;
  lo.timeout_ms = static_cast<int64_t>(cfg->run.timeouts.compute_s * 1000);
  if (on_nodes) {
    auto nodes = cluster::read_job_nodes(job_dir);
    if (!nodes) {
      std::fprintf(stderr, "troupe driver: %s\n", describe(nodes.error()).c_str());
      return 1;
    }
    lo.remote = cluster::remote_launch{nodes->bind_host, nodes->nodes, {}, {}};
  }
  // (SIGPIPE is ignored in main: the controller's connection may drop at
  // any moment, and a write to it must not end the job.)
  expected<actors::rl::job_summary> summary = make_error(errc::internal, "not run");
  signal_watcher signals{stop_bounds_of(*cfg)}; // outlives the actor system
  {
    caf::actor_system_config sys_cfg;
    actors::configure(sys_cfg);
    cluster::configure_network(sys_cfg);
    caf::actor_system sys{sys_cfg};
    auto front = publish_front(sys, job_dir);
    if (!front) {
      std::fprintf(stderr, "troupe driver: cannot publish the driver link: %s\n", describe(front.error()).c_str());
      return 1;
    }
    if (lo.remote) {
      lo.remote->ask_for_workers = [f = *front](const cluster::worker_request_file& w) {
        caf::anon_send(f, cluster::workers_atom::value, w);
      };
      lo.remote->replace_worker = [&sys, f = *front](const cluster::worker_entry& x) {
        return cluster::ask_for_worker_again(sys, f, x);
      };
    }
    actors::rl::run_options ro;
    ro.resume = resume;
    ro.factories = cluster::process_factories();
    ro.on_spawn = [&, f = *front](const actors::job::job_actor& job) {
      signals.watch(job);
      caf::anon_send(f, cluster::driver_job_atom::value, caf::actor_cast<caf::actor>(job));
    };
    summary = cluster::run_placed_job(sys, *cfg, ro, lo);
    signals.forget();
    // The front lives until told to go (the system's end waits for it); the
    // controller's link goes down with it.
    caf::anon_send_exit(*front, caf::exit_reason::user_shutdown);
  }
  if (!summary) {
    std::fprintf(stderr, "troupe driver: %s\n", describe(summary.error()).c_str());
    return 1;
  }
  return summary->stopped ? signal_watcher::exit_status() : 0;
}

} // namespace troupe::apps
