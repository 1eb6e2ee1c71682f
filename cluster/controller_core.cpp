#include "cluster/controller_core.hpp"

#include "cluster/node_placement.hpp"

#include <algorithm>

namespace troupe::cluster {

// ---- transitions ----------------------------------------------------------

bool transition_allowed(ctl_state from, ctl_state to) noexcept {
  using s = ctl_state;
  if (from == to)
    return false;
  switch (from) {
  case s::queued: // admitted, cancelled while queued, or its driver could not start
    return to == s::pending || to == s::cancelled || to == s::failed;
  case s::pending: // the driver's job actor starts, or ends before it does
    return to == s::preparing || to == s::failed || to == s::cancelled || to == s::lost;
  case s::preparing:
    return to == s::running || to == s::failed || to == s::cancelled || to == s::lost;
  case s::running:
    return to == s::paused || to == s::succeeded || to == s::failed || to == s::cancelled ||
           to == s::lost;
  case s::paused:
    return to == s::running || to == s::succeeded || to == s::failed || to == s::cancelled ||
           to == s::lost;
  case s::succeeded:
    return false;
  case s::failed:
  case s::cancelled:
  case s::lost: // resumed from its last checkpoint
    return to == s::queued;
  }
  return false;
}

void job_book::restore(ctl_state state, std::vector<transition_view> history) {
  state_ = state;
  transitions_ = std::move(history);
}

bool job_book::move(ctl_state to, int64_t time_us, std::string reason) {
  if (!transition_allowed(state_, to))
    return false;
  if (!transitions_.empty() && time_us < transitions_.back().time_us)
    return false;
  state_ = to;
  transitions_.push_back({to, time_us, std::move(reason)});
  return true;
}

// ---- admission ------------------------------------------------------------

void admission::remove(const std::string& id) {
  queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
}

int64_t admission::position(const std::string& id) const {
  auto it = std::find(queue_.begin(), queue_.end(), id);
  return it == queue_.end() ? 0 : static_cast<int64_t>(it - queue_.begin()) + 1;
}

namespace {

// Devices each node holds for the running jobs.
std::map<std::string, int64_t> devices_in_use(const std::vector<running_job>& running) {
  std::map<std::string, int64_t> used;
  for (const auto& r : running)
    for (size_t i = 0; i < r.nodes.size() && i < r.node_need.size(); ++i)
      used[r.nodes[i]] += r.node_need[i];
  return used;
}

bool wants_nodes(const admission_request& head, const std::vector<node_view>& nodes) {
  using actors::rl::launcher_kind;
  if (head.node_need.empty())
    return false; // every role runs in its driver
  if (head.launcher == launcher_kind::nodes)
    return true;
  bool any_ready =
      std::any_of(nodes.begin(), nodes.end(), [](const node_view& n) { return n.state == node_state::ready; });
  return head.launcher == launcher_kind::automatic && any_ready;
}

} // namespace

admission_decision admission::decide(const admission_request& head, const std::vector<running_job>& running,
                                     const std::vector<node_view>& nodes) const {
  admission_decision d;
  if (static_cast<int64_t>(running.size()) >= max_running_) {
    d.wait_reason = "waiting for one of the " + std::to_string(max_running_) + " running jobs to end";
    return d;
  }
  d.on_nodes = wants_nodes(head, nodes);
  if (d.on_nodes) {
    auto picked = assign_nodes(head.node_need, nodes, devices_in_use(running));
    if (!picked) {
      d.wait_reason = context_of(picked.error());
      return d;
    }
    d.nodes = std::move(*picked);
  }
  d.cores = d.on_nodes ? 1 : std::min(head.cores, cores_total_);
  int64_t used = 0;
  for (const auto& r : running)
    used += r.cores;
  if (used + d.cores > cores_total_) {
    d.wait_reason = "waiting for cores on the controller's machine";
    d.nodes.clear();
    return d;
  }
  d.start = true;
  return d;
}

// ---- recovery -------------------------------------------------------------

recovery_step plan_recovery(ctl_state state, int64_t recorded_pid, const std::optional<driver_info>& info,
                            bool running) {
  if (state == ctl_state::queued)
    return recovery_step::requeue;
  if (is_final(state))
    return recovery_step::keep;
  if (info && info->pid == recorded_pid && recorded_pid > 0 && running)
    return recovery_step::reattach;
  return recovery_step::settle;
}

} // namespace troupe::cluster
