#pragma once
// Restart policies of the rl stage's roles (internal to actors/rl).
//
// NOTE [supervision]: a role is *lost* when its actor or process went away
// while the job needed it — the role proxy saw it go down (a crash, a kill,
// a process whose connection dropped), or a request found its actor
// already gone; such errors carry errc::lost, which nothing a role returns
// does. An error a role *returns* (bad input, a failed step,
// debug.fail_role) fails the job as before. When a phase of an iteration
// fails with a loss, the driver asks the restart policy whether the role
// may restart: within the role's max_restarts in a sliding window_s, and
// within the job's budget (supervision.*; defaults from role_traits). If
// so it emits role events "restarting" (the cause, the attempt), waits
// the backoff, puts a new instance of the role in the cast (NOTE [the
// cast]: its process restarted where it ran in a worker), brings it back
// to the job's state (the rollout: the weight version last published, and
// the batches sampled ahead it held, asked for again in their order),
// emits "restarted" (the time it took) and runs the interrupted phase
// again from its start with the same requests. Where the lost work is a
// pure function of the requests and weights — synchronous mode, fixed
// seeds — the recovered run equals an uninterrupted one (docs/
// supervision.md says what differs elsewhere). When the policy refuses,
// the job fails with the loss and every restart so far.

#include "actors/rl/job_config.hpp"
#include "actors/rl/role_traits.hpp"
#include "actors/rl/roles.hpp"
#include "actors/train/dp_strategy.hpp"
#include "runtime/error.hpp"

#include <string>
#include <vector>

namespace troupe::actors::rl::detail {

/// The effective restart limits of `role` under `config` (its entry, else
/// its defaults from role_traits).
role_restart_config restart_limits(const supervision_config& config, role_id role);

/// NOTE [peer state]: whether a trainer laid out as `layout` under
/// `strategy` can take a lost rank's state from a surviving one: every
/// rank holds the whole state (ddp, no model parallelism) and there is
/// another rank.
inline bool peer_restorable(const parallel_layout& layout, train::dp_strategy strategy) {
  return layout.dp >= 2 && layout.tp == 1 && layout.pp == 1 && strategy == train::dp_strategy::ddp;
}

/// NOTE [peer state]: whether the ranks of trainer `role` keep, in
/// `stage`, the state each of its updates begins from: the rl stage, the
/// role may restart, and a peer can restore it (its layout and strategy
/// as the job places it). The plan's memory estimate counts the copy.
bool keeps_state_before_updates(const job_config& cfg, std::string_view stage, role_id role);

/// One restart, for the events and the final error.
struct restart_record {
  role_id role = role_id::rollout;
  /// The role's restart count, from 1.
  int attempt = 0;
  /// The iteration (from 1) and phase it was lost in.
  int64_t step = 0;
  std::string phase;
  /// The loss, as described.
  std::string cause;
  /// Seconds since the policy began when the loss was seen.
  double at_s = 0;
  /// Seconds to recover (negative until it has).
  double recover_s = -1;
};

class restart_policy {
public:
  explicit restart_policy(supervision_config config);

  /// The effective limits of `role` (its entry, else its defaults).
  role_restart_config limits(role_id role) const;

  /// Admits a restart of `role`, lost at `at_s` in iteration `step`'s
  /// `phase` because of `cause`: answers the record (its attempt set),
  /// kept as the latest. Refused (errc::lost, naming the cause, the limit
  /// reached and every restart so far) beyond the role's max_restarts in
  /// its window or the job's budget.
  expected<restart_record> admit(role_id role, double at_s, int64_t step, std::string phase,
                                 const caf::error& cause);
  /// The latest admitted restart recovered in `seconds`.
  void recovered(double seconds);

  const std::vector<restart_record>& history() const { return history_; }
  /// "rollout in iteration 2, gen (recovered in 1.2 s): <cause>; ..."
  std::string describe_history() const;

private:
  supervision_config config_;
  std::vector<restart_record> history_;
};

} // namespace troupe::actors::rl::detail
