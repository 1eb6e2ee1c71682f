// The names of the controller's job states and of node states: light
// definitions that the lean `troupe` client links without the controller
// (NOTE [lean client] in apps/cli.hpp).
#include "cluster/controller.hpp"
#include "cluster/node_registry.hpp"

namespace troupe::cluster {

namespace j = actors::job;

std::optional<ctl_state> parse_ctl_state(std::string_view s) noexcept {
  return enum_from_name<ctl_state>(s);
}

ctl_state ctl_state_of(j::job_state s) noexcept {
  // The job actor's states keep their names.
  return *parse_ctl_state(j::to_string(s));
}

bool is_final(ctl_state s) noexcept {
  return s == ctl_state::succeeded || s == ctl_state::failed || s == ctl_state::cancelled ||
         s == ctl_state::lost;
}

} // namespace troupe::cluster
