#pragma once
// The one table of the cast's roles: what each is and where it takes part.
// Spawn order, placement, config checks, role construction, offload, fault
// injection and the RL driver's phase → role mapping all read it; nothing
// else names a role to decide what it does (NOTE [the cast] in cast.hpp).

#include "models/config.hpp"
#include "runtime/enum_names.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::actors::rl {

/// The roles, in spawn order.
enum class role_id : uint8_t { policy, critic, reference, reward, rollout };
TROUPE_ENUM_NAMES(role_id, "policy", "critic", "reference", "reward", "rollout")

/// The stages, in the order a job runs them (NOTE [stage table]).
enum class stage_id : uint8_t { sft, rm, dpo, rl };
TROUPE_ENUM_NAMES(stage_id, "sft", "rm", "dpo", "rl")

/// What actor a role is built as.
enum class role_actor : uint8_t {
  /// A train engine (actors/train): an optimizer where it trains, frozen
  /// elsewhere; DP ranks behind an engine group.
  trainer,
  /// The inference engine (actors/inference/rollout.hpp).
  rollout,
  /// Where it does not train: the reward actor (rule and / or model
  /// scores); where it trains (the rm stage): a trainer.
  judge,
};

struct role_traits {
  role_id id;
  std::string_view name;
  /// The stages that train it (an optimizer; DP ranks allowed there).
  std::vector<stage_id> trained_in;
  /// The model head.
  models::head_kind head;
  role_actor actor;
  /// Salt of the seed its model is loaded with in the rl stage (fresh heads
  /// equal everywhere).
  uint64_t seed_salt;
  /// The RL phases in which the driver asks it for work (NOTE [rl iteration]).
  std::vector<std::string_view> rl_phases;
  /// The RL phase after which it is idle until the next iteration: co-located
  /// offload frees its state then ("" = never).
  std::string_view rl_idle_after;
  /// debug.fail_role may name it (its actor fails its next request on demand).
  bool injectable;
  /// Restarts allowed in supervision's window when the job file does not
  /// say (NOTE [supervision]); 0 = a loss fails the job.
  int64_t default_restarts;
  /// The RL phase that updates its weights ("" = none): a DP rank lost in
  /// it hands its replacement the state from before it (NOTE [peer state]).
  std::string_view rl_update_phase;

  bool trains_in(stage_id stage) const {
    for (auto s : trained_in)
      if (s == stage)
        return true;
    return false;
  }
  /// Trained in some stage: data parallelism is allowed (placement dp).
  bool trains() const { return !trained_in.empty(); }
  /// The actor it is built as in `stage`.
  role_actor actor_in(stage_id stage) const {
    return actor == role_actor::judge && trains_in(stage) ? role_actor::trainer : actor;
  }
  /// A head its starting model may lack (initialised fresh): a non-lm head
  /// of a stage that trains it (the critic's value head, the rm stage's
  /// reward head).
  bool fresh_head_in(stage_id stage) const {
    return trains_in(stage) && head != models::head_kind::lm;
  }
};

/// Every role, in spawn order (index = role_id).
const std::vector<role_traits>& all_roles();
/// The traits of `name`; null for an unknown role.
const role_traits* find_role(std::string_view name);
const role_traits& traits_of(role_id id);
/// The role doing `phase` of an RL iteration (null for a driver-only phase).
const role_traits* role_of_phase(std::string_view phase);
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
