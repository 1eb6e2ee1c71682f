#include "cluster/role_host.hpp"

#include "actors/rl/supervision.hpp"
#include "actors/role_proxy.hpp"
#include "runtime/enum_names.hpp"

#include "cluster/local_launcher.hpp"

#include <caf/all.hpp>

#include <filesystem>
#include <set>

namespace troupe::cluster {

expected<std::unique_ptr<worker_host>> worker_host::launch(caf::actor_system& sys,
                                                           const actors::rl::placement_plan& plan,
                                                           launch_options options) {
  if (!plan.uses_workers())
    return make_error(errc::invalid_argument, "worker host: the placement runs no workers");
  options.roles = plan.worker_labels();
  if (options.remote) {
    if (static_cast<int64_t>(options.remote->nodes.size()) != plan.nodes)
      return make_error(errc::invalid_argument,
                        "worker host: the plan has " + std::to_string(plan.nodes) + " nodes, the controller gave " +
                            std::to_string(options.remote->nodes.size()));
    options.remote->node_of.clear();
    for (const auto& d : plan.devices)
      options.remote->node_of.push_back(d.node);
  }
  auto w = worker_set::launch(sys, options);
  if (!w)
    return w.error();
  std::unique_ptr<worker_host> out{new worker_host()};
  if (options.remote)
    out->store_host_ = options.remote->bind_host;
  out->workers_ = std::move(*w);
  out->plan_ = plan;
  out->timeout_ms_ = options.timeout_ms;
  return out;
}

expected<std::vector<caf::actor>> worker_host::spawn(caf::actor_system& sys,
                                                     const actors::rl::role_spec& spec) {
  const auto* a = plan_.find(spec.role);
  if (!a)
    return make_error(errc::invalid_argument, "the placement has no role '" + spec.role + "'");
  if (spec.layout.ranks() > static_cast<int32_t>(a->devices.size()))
    return make_error(errc::invalid_argument, spec.role + ": " + std::to_string(spec.layout.ranks()) +
                                                  " ranks but " + std::to_string(a->devices.size()) +
                                                  " devices placed");
  auto& built = built_on_[spec.role];
  for (int32_t r = 0; r < spec.layout.ranks(); ++r) {
    auto d = a->devices[static_cast<size_t>(r)];
    built[d] = workers_.generation(static_cast<int>(d));
  }
  return actors::rl::spawn_ranks(spec, stores_, store_host_, [&](const actors::rl::role_spec& rs) -> expected<caf::actor> {
    auto device = a->devices[static_cast<size_t>(rs.rank)];
    const auto& w = workers_.workers()[static_cast<size_t>(device)];
    auto s = rs;
    s.host = w.host;
    auto name = actors::rl::rank_name(s.role, s.layout, s.rank) + " (worker " +
                std::to_string(w.rank) + (w.node.empty() ? "" : " on node " + w.node) + ", pid " +
                std::to_string(w.pid) + ")";
    expected<caf::actor> out = make_error(errc::internal, name + ": no answer");
    // Building loads a model (and may wait for the other DP ranks).
    auto bound = std::max<int64_t>(timeout_ms_, s.timeout_ms) * 2;
    caf::scoped_actor self{sys};
    self->request(w.handle, std::chrono::milliseconds(bound), spawn_role_atom::value, s)
        .receive([&](caf::actor& x) { out = actors::spawn_role_proxy(sys, std::move(x), name); },
                 [&](caf::error& e) {
                   out = e.category() == error_category() ? with_prefix(e, "spawning " + name)
                                                          : make_error(errc::unavailable,
                                                                       "spawning " + name + ": " +
                                                                           sys.render(e));
                 });
    return out;
  });
}

std::string worker_host::store_host() const {
  return store_host_;
}

std::string worker_host::address_of(const std::string& role, int rank) const {
  auto d = plan_.device_of(role, rank);
  if (d < 0 || static_cast<size_t>(d) >= workers_.workers().size())
    return role_host::address_of(role, rank);
  return workers_.workers()[static_cast<size_t>(d)].host;
}

actors::rl::role_host::place worker_host::where(const std::string& role, int rank) const {
  auto d = plan_.device_of(role, rank);
  if (d < 0 || static_cast<size_t>(d) >= workers_.workers().size())
    return role_host::where(role, rank);
  const auto& w = workers_.workers()[static_cast<size_t>(d)];
  return {"worker " + std::to_string(d), w.pid, w.node};
}

int worker_host::exit_signal(const std::string& role, int rank, int64_t timeout_ms) {
  auto d = plan_.device_of(role, rank);
  if (d < 0)
    return 0;
  // The process the role was built on, which may have been replaced since.
  auto built = built_on_.find(role);
  int generation = -1;
  if (built != built_on_.end())
    if (auto b = built->second.find(d); b != built->second.end())
      generation = b->second;
  return workers_.exit_signal(static_cast<int>(d), timeout_ms, generation);
}

expected<void> worker_host::revive(const actors::rl::role_spec& spec) {
  std::set<int64_t> devices;
  for (int32_t r = 0; r < spec.layout.ranks(); ++r)
    devices.insert(plan_.device_of(spec.role, r));
  const auto& built = built_on_[spec.role];
  for (auto d : devices) {
    if (d < 0)
      continue;
    // Started again since the role was built there (for a role lost with
    // it): the old process is gone already.
    auto b = built.find(d);
    if (b != built.end() && workers_.generation(static_cast<int>(d)) > b->second)
      continue;
    if (auto ok = workers_.revive(static_cast<int>(d)); !ok)
      return ok;
  }
  return {};
}

bool worker_host::stale(const std::string& role) const {
  auto built = built_on_.find(role);
  if (built == built_on_.end())
    return false;
  for (const auto& [device, generation] : built->second)
    if (workers_.generation(static_cast<int>(device)) > generation)
      return true;
  return false;
}

std::string worker_host::loss_detail(const std::string& role, int rank) const {
  auto d = plan_.device_of(role, rank);
  return d < 0 ? "" : workers_.hung(static_cast<int>(d));
}

caf::error worker_host::check() { return workers_.check(); }

expected<void> worker_host::shutdown(int64_t timeout_ms) { return workers_.shutdown(timeout_ms); }

namespace {

// Per worker of `plan`: whether the supervision may restart every role
// rank it hosts (NOTE [replacing a worker] in job_nodes.hpp).
std::vector<bool> restartable_workers(const actors::rl::placement_plan& plan,
                                      const actors::rl::supervision_config& s) {
  std::vector<bool> out;
  for (const auto& d : plan.devices) {
    bool all = s.budget > 0 && !d.ranks.empty();
    for (const auto& rank : d.ranks) {
      auto role = enum_from_name<actors::rl::role_id>(rank.substr(0, rank.find('[')));
      all = all && role && actors::rl::detail::restart_limits(s, *role).max_restarts > 0;
    }
    out.push_back(all);
  }
  return out;
}

} // namespace

expected<actors::rl::job_summary> run_placed_job(caf::actor_system& sys,
                                                 const actors::rl::job_config& cfg,
                                                 actors::rl::run_options opts,
                                                 launch_options options) {
  auto plan = actors::rl::make_plan(cfg);
  if (!plan)
    return plan.error();
  if (cfg.resources.launcher == actors::rl::launcher_kind::nodes && !options.remote)
    return make_error(errc::invalid_config,
                      "resources.launcher nodes: node agents start this job's workers; submit it to a "
                      "controller with nodes (troupe submit), or use launcher local or auto");
  if (!plan->uses_workers())
    return actors::rl::run_job(sys, cfg, opts);
  if (options.log_dir.empty())
    options.log_dir = (std::filesystem::absolute(cfg.run.dir) / "workers").string();
  options.heartbeat_ms = static_cast<int64_t>(cfg.supervision.heartbeat_s * 1000);
  if (options.remote)
    options.remote->restartable = restartable_workers(*plan, cfg.supervision);
  if (options.executable.empty()) {
    auto exe = self_executable();
    if (!exe)
      return exe.error();
    options.executable = *exe;
  }
  auto host = worker_host::launch(sys, *plan, options);
  if (!host)
    return with_prefix(host.error(), "placement " + std::string{to_string(plan->mode)});
  opts.host = host->get();
  auto summary = actors::rl::run_job(sys, cfg, opts);
  if (!summary) {
    // A dead worker explains the error best: say how it ended.
    if (auto died = (*host)->check())
      summary = make_error(errc::process_failed,
                           context_of(summary.error()) + "; " + context_of(died));
    [[maybe_unused]] auto ignored = (*host)->shutdown(5000);
    return summary;
  }
  if (auto ok = (*host)->shutdown(options.timeout_ms); !ok)
    return ok.error();
  return summary;
}

} // namespace troupe::cluster
