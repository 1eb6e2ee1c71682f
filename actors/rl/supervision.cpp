#include "actors/rl/supervision.hpp"

#include "actors/rl/placement.hpp"

#include <algorithm>
#include <cstdio>

namespace troupe::actors::rl::detail {

restart_policy::restart_policy(supervision_config config) : config_(std::move(config)) {}

role_restart_config restart_policy::limits(role_id role) const {
  return restart_limits(config_, role);
}

role_restart_config restart_limits(const supervision_config& config, role_id role) {
  const auto& t = traits_of(role);
  role_restart_config out;
  for (const auto& r : config.roles)
    if (r.role == t.name)
      out = r;
  out.role = std::string{t.name};
  if (out.max_restarts < 0)
    out.max_restarts = t.default_restarts;
  return out;
}

bool keeps_state_before_updates(const job_config& cfg, std::string_view stage, role_id role) {
  if (stage != "rl" || restart_limits(cfg.supervision, role).max_restarts <= 0)
    return false;
  const auto placed = placement_keys(cfg, traits_of(role).name);
  const parallel_layout layout{static_cast<int32_t>(placed.dp), static_cast<int32_t>(placed.tp),
                               static_cast<int32_t>(placed.pp)};
  return peer_restorable(layout, placed.strategy);
}

expected<restart_record> restart_policy::admit(role_id role, double at_s, int64_t step,
                                               std::string phase, const caf::error& cause) {
  const auto lim = limits(role);
  const auto name = std::string{traits_of(role).name};
  int in_window = 0, attempts = 0;
  for (const auto& r : history_)
    if (r.role == role) {
      ++attempts;
      in_window += at_s - r.at_s < lim.window_s ? 1 : 0;
    }
  std::string refusal;
  if (lim.max_restarts == 0)
    refusal = name + " is not restarted (supervision.roles max_restarts 0)";
  else if (in_window >= lim.max_restarts)
    refusal = name + " was restarted " + std::to_string(in_window) + " times within " +
              std::to_string(static_cast<int64_t>(lim.window_s)) +
              " s (supervision.roles max_restarts " + std::to_string(lim.max_restarts) + ")";
  else if (static_cast<int64_t>(history_.size()) >= config_.budget)
    refusal = "the job's restart budget is spent (supervision.budget " +
              std::to_string(config_.budget) + ")";
  if (!refusal.empty()) {
    auto text = context_of(cause) + "; " + refusal;
    if (!history_.empty())
      text += "; restarts so far: " + describe_history();
    return make_error(errc::lost, text);
  }
  restart_record rec;
  rec.role = role;
  rec.attempt = attempts + 1;
  rec.step = step;
  rec.phase = std::move(phase);
  rec.cause = describe(cause);
  rec.at_s = at_s;
  history_.push_back(rec);
  return rec;
}

void restart_policy::recovered(double seconds) {
  if (!history_.empty())
    history_.back().recover_s = seconds;
}

std::string restart_policy::describe_history() const {
  std::string out;
  for (const auto& r : history_) {
    char took[64];
    if (r.recover_s >= 0)
      std::snprintf(took, sizeof took, "recovered in %.2f s", r.recover_s);
    else
      std::snprintf(took, sizeof took, "not recovered");
    out += (out.empty() ? "" : "; ") + std::string{traits_of(r.role).name} + " #" +
           std::to_string(r.attempt) + " in iteration " + std::to_string(r.step) +
           (r.phase.empty() ? "" : ", " + r.phase) + " (" + took + "): " + r.cause;
  }
  return out;
}

} // namespace troupe::actors::rl::detail
