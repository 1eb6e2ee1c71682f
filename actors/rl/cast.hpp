#pragma once
// The cast of a stage as one object (internal to actors/rl).
//
// NOTE [the cast]: a stage's roles live in one `cast`, keyed by role_id.
// Each member holds its traits (role_traits.hpp), the spec it was built
// from, its rank actors as the role host answered them, the handle the
// driver talks to (the rank itself, or the engine group of its DP ranks),
// where each rank runs, and a generation number that replace() bumps, so a
// message or a process group of an older generation can be told apart from
// the current one. Loops over roles — stopping, offloading after a phase,
// fault injection — go through the cast and read the traits; nothing
// switches on a role's name. Restarting a rank is replace(id, rank, actor).

#include "actors/job/events.hpp"
#include "actors/rl/role_traits.hpp"
#include "actors/rl/roles.hpp"
#include "actors/train/dp_strategy.hpp"
#include "runtime/error.hpp"

#include <caf/actor.hpp>
#include <caf/actor_cast.hpp>
#include <caf/fwd.hpp>
#include <caf/timespan.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::actors::rl::detail {

/// What a cast needs of the job around it.
struct cast_env {
  caf::actor_system* sys = nullptr;
  /// The driver actor: requests go out from it.
  caf::blocking_actor* self = nullptr;
  role_host* host = nullptr;
  /// The resolved job every role spec carries (NOTE [role hosting]).
  std::string job_yaml;
  /// The layout of a role in the stage (the plan's; NOTE [parallel layout]).
  std::function<parallel_layout(role_id)> layout_of;
  /// How a role's DP ranks train (the plan's).
  std::function<train::dp_strategy(role_id)> strategy_of;
  /// Emits the job's role events.
  std::function<void(job::event_body)> emit;
  /// Bounds the DP group's rendezvous and its collectives (compute timeout).
  int64_t group_timeout_ms = 60000;
  /// Bounds releasing a role's idle state.
  caf::timespan control_timeout{std::chrono::seconds(60)};
  caf::timespan state_timeout{std::chrono::seconds(600)};
  /// Where trainers write their offloaded state.
  std::string offload_dir;
  /// NOTE [rollback]: the stage's rollbacks so far; after one, the roles'
  /// groups meet under a prefix of the rollback's.
  int rollbacks = 0;
};

struct cast_member {
  const role_traits* traits = nullptr;
  /// The spec it was built from (rank 0's; each rank's dp fields differ).
  role_spec spec;
  /// One actor per DP rank, as the role host answered them.
  std::vector<caf::actor> ranks;
  /// What the driver talks to: the only rank, or the engine group.
  caf::actor handle;
  /// Bumped by every replace().
  uint64_t generation = 0;
};

class cast {
public:
  cast(cast_env env, stage_id stage);
  cast(cast&&) noexcept;
  cast& operator=(cast&&) noexcept;
  cast(const cast&) = delete;
  cast& operator=(const cast&) = delete;
  /// Stops whatever is still in the cast.
  ~cast();

  stage_id stage() const { return stage_; }

  /// Builds `role` (every DP rank of it, on the host) from `model_dir`
  /// ("" for a rule-only reward) with role events around it. A role is
  /// spawned once; on failure nothing of it is left running.
  expected<void> spawn(role_id role, const std::string& model_dir);

  bool has(role_id role) const;
  /// The member of `role`; null when it is not in the cast.
  const cast_member* member(role_id role) const;
  /// The handle the driver talks to (an invalid actor when absent).
  caf::actor handle(role_id role) const;
  /// The handle as a typed actor of the role's interface.
  template <class Handle>
  Handle handle_as(role_id role) const {
    return caf::actor_cast<Handle>(handle(role));
  }
  /// Every member, in spawn order.
  void for_each(const std::function<void(const cast_member&)>& f) const;
  /// The role's current generation (0 until replaced).
  uint64_t generation(role_id role) const;

  /// Stops every member; the cast is empty afterwards.
  void stop();
  /// Co-located offload after RL phase `phase`: frees the idle state of each
  /// member whose traits name `phase` as the one after which it is idle
  /// (the rollout's KV pool; a trainer's optimizer state and gradients, to
  /// disk; a reward model's weights), except those `keep` names. Answers
  /// the bytes freed (nullopt when no member was asked) and adds their
  /// serving seconds to `busy_s`.
  expected<std::optional<int64_t>>
  release_after(std::string_view phase, const std::function<bool(role_id)>& keep, double& busy_s);
  /// Makes `role` fail its next request (debug.fail_role); false when it is
  /// absent or not injectable.
  bool inject(role_id role);
  /// Puts `fresh` in place of rank `rank` of `role` (a restarted rank) and
  /// bumps the role's generation. A DP group's ranks are not swapped yet:
  /// errc::unsupported.
  expected<void> replace(role_id role, int rank, caf::actor fresh);
  /// NOTE [supervision]: builds `role` again, every rank of it, in place
  /// of the instance that was lost (ended first): the host revives its
  /// processes, the groups meet under the next generation's prefix, and
  /// the generation is bumped. The new instance starts as the first did
  /// (its model from the same directory); bringing it to the job's state
  /// is the driver's.
  expected<void> respawn(role_id role);
  /// NOTE [rollback]: starts again the processes of `role` that ended
  /// (the host's revive), before the cast is spawned anew.
  expected<void> revive(role_id role);
  /// NOTE [kill injection]: rank `rank` of `role` dies at its next request
  /// (its process, where a worker hosts it) — with `collective` n > 0,
  /// inside the n-th operation of its DP group instead (NOTE [kill inside
  /// a collective]), or with `hang`, blocks there for good while its worker
  /// runs on (in the driver's process a hang dies as a kill would); false
  /// when there is no such rank.
  bool kill(role_id role, int rank, int64_t collective = 0, bool hang = false);
  /// Emits `ev` (status, reason, phase, attempt...) for every rank of
  /// `role`, with each rank's place filled in.
  void announce(role_id role, job::role_changed ev) const;

private:
  void announce(const role_spec& spec, const char* status, const std::string& reason) const;
  void announce(const role_spec& spec, job::role_changed ev) const;
  /// The handle the driver talks to for `m`'s ranks.
  expected<caf::actor> handle_of(const cast_member& m) const;
  /// The rendezvous prefix of `spec`'s groups in generation `generation`.
  std::string group_name(const role_spec& spec, uint64_t generation) const;

  cast_env env_;
  stage_id stage_;
  std::vector<cast_member> members_; // spawn order
};

} // namespace troupe::actors::rl::detail
