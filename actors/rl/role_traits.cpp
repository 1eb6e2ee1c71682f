#include "actors/rl/role_traits.hpp"

namespace troupe::actors::rl {

const std::vector<role_traits>& all_roles() {
  using models::head_kind;
  using s = stage_id;
  static const std::vector<role_traits> table{
      {role_id::policy,
       "policy",
       {s::sft, s::dpo, s::rl},
       head_kind::lm,
       role_actor::trainer,
       41,
       {"old_log_prob", "update_actor", "weight_sync"},
       "weight_sync",
       true,
       0,
       "update_actor"},
      {role_id::critic,
       "critic",
       {s::rl},
       head_kind::value,
       role_actor::trainer,
       42,
       {"values", "update_critic"},
       "update_critic",
       true,
       0,
       "update_critic"},
      {role_id::reference,
       "reference",
       {},
       head_kind::lm,
       role_actor::trainer,
       43,
       {"ref"},
       "ref",
       true,
       3,
       ""},
      {role_id::reward,
       "reward",
       {s::rm},
       head_kind::reward,
       role_actor::judge,
       44,
       {"reward"},
       "reward",
       true,
       3,
       ""},
      {role_id::rollout,
       "rollout",
       {},
       head_kind::lm,
       role_actor::rollout,
       45,
       {"gen", "evaluate"},
       "gen",
       false,
       3,
       ""},
  };
  return table;
}

const role_traits* find_role(std::string_view name) {
  auto id = enum_from_name<role_id>(name);
  return id ? &traits_of(*id) : nullptr;
}

const role_traits& traits_of(role_id id) {
  return all_roles()[static_cast<size_t>(id)];
}

const role_traits* role_of_phase(std::string_view phase) {
  for (const auto& r : all_roles())
    for (auto p : r.rl_phases)
      if (p == phase)
        return &r;
  return nullptr;
}

} // namespace troupe::actors::rl
