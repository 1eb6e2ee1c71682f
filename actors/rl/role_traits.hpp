#pragma once
// The one table of the cast's roles: what each is and where it takes part.
// Spawn order, placement, config checks, fault injection and the RL
// driver's phase → role mapping all read it.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::actors::rl {

enum class role_id { policy, critic, reference, reward, rollout };

struct role_traits {
  role_id id;
  std::string_view name;
  /// The stages that train it (an optimizer; DP ranks allowed).
  std::vector<std::string_view> trained_in;
  /// The model head: lm, value or reward.
  std::string_view head;
  /// Salt of the seed its model is loaded with (fresh heads equal everywhere).
  uint64_t seed_salt;
  /// The RL phases in which the driver asks it for work (NOTE [rl iteration]).
  std::vector<std::string_view> rl_phases;
  /// debug.fail_role may name it (its actor fails its next request on demand).
  bool injectable;

  bool trains_in(std::string_view stage) const {
    for (auto s : trained_in)
      if (s == stage)
        return true;
    return false;
  }
};

/// Every role, in spawn order.
const std::vector<role_traits>& all_roles();
/// The traits of `name`; null for an unknown role.
const role_traits* find_role(std::string_view name);
const role_traits& traits_of(role_id id);
/// The role doing `phase` of an RL iteration ("" for a driver-only phase).
std::string_view role_of_phase(std::string_view phase);
/// "policy, critic, ..." of the roles passing `keep`.
template <class F>
std::string role_names(F keep) {
  std::string out;
  for (const auto& r : all_roles())
    if (keep(r))
      out += (out.empty() ? "" : ", ") + std::string{r.name};
  return out;
}

} // namespace troupe::actors::rl
