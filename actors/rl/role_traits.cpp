#include "actors/rl/role_traits.hpp"

namespace troupe::actors::rl {

const std::vector<role_traits>& all_roles() {
  static const std::vector<role_traits> table{
      {role_id::policy,
       "policy",
       {"sft", "rl"},
       "lm",
       41,
       {"old_log_prob", "update_actor", "weight_sync"},
       true},
      {role_id::critic, "critic", {"rl"}, "value", 42, {"values", "update_critic"}, true},
      {role_id::reference, "reference", {}, "lm", 43, {"ref"}, true},
      {role_id::reward, "reward", {"rm"}, "reward", 44, {"reward"}, true},
      {role_id::rollout, "rollout", {}, "lm", 45, {"gen", "evaluate"}, false},
  };
  return table;
}

const role_traits* find_role(std::string_view name) {
  for (const auto& r : all_roles())
    if (r.name == name)
      return &r;
  return nullptr;
}

const role_traits& traits_of(role_id id) {
  return all_roles()[static_cast<size_t>(id)];
}

std::string_view role_of_phase(std::string_view phase) {
  for (const auto& r : all_roles())
    for (auto p : r.rl_phases)
      if (p == phase)
        return r.name;
  return {};
}

} // namespace troupe::actors::rl
