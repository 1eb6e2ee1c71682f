// The names of the controller's job states and of node states: light
// definitions that the lean `troupe` client links without the controller
// (NOTE [lean client] in apps/cli.hpp).
#include "cluster/controller.hpp"
#include "cluster/node_registry.hpp"

namespace troupe::cluster {

namespace j = actors::job;

namespace {

constexpr std::string_view ctl_state_names[ctl_state_count] = {
    "queued", "pending", "preparing", "running", "paused", "succeeded", "failed", "cancelled", "lost"};

} // namespace

std::string_view to_string(ctl_state s) noexcept {
  return ctl_state_names[static_cast<int>(s)];
}

std::optional<ctl_state> parse_ctl_state(std::string_view s) noexcept {
  for (int i = 0; i < ctl_state_count; ++i)
    if (ctl_state_names[i] == s)
      return static_cast<ctl_state>(i);
  return std::nullopt;
}

ctl_state ctl_state_of(j::job_state s) noexcept {
  // The job actor's states keep their names.
  return *parse_ctl_state(j::to_string(s));
}

bool is_final(ctl_state s) noexcept {
  return s == ctl_state::succeeded || s == ctl_state::failed || s == ctl_state::cancelled ||
         s == ctl_state::lost;
}

std::string_view to_string(node_state s) noexcept {
  switch (s) {
  case node_state::ready: return "ready";
  case node_state::lost: return "lost";
  case node_state::left: return "left";
  }
  return "?";
}

} // namespace troupe::cluster
