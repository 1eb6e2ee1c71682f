#pragma once
// Kill injection for tests of supervision (debug.kills).
//
// NOTE [kill injection]: a role told to die (inject_kill_atom) dies at its
// next request, while it holds it, as an out-of-memory kill or a crash
// would: in a worker process the whole process ends by SIGKILL (the other
// roles it hosts with it); in the driver's process the role's actor ends
// (exit reason kill) without answering. Either way nothing answers the
// request, and the role's proxy fails it as lost (NOTE [role proxy] in
// actors/role_proxy.hpp), which is what the job's supervision sees (NOTE
// [supervision] in actors/rl/supervision.hpp). Unlike debug.fail_role — an
// error the role returns, which fails the job — a kill is recovered from.

#include <caf/atom.hpp>
#include <caf/fwd.hpp>

#include <functional>
#include <memory>

namespace troupe::actors {

/// Driver → role: die at your next request; the flag says whether the
/// whole process goes (a worker's) or the actor alone (the driver's). A
/// DP rank of a trainer also takes (bool, n): die at the n-th operation of
/// its DP group from now on (NOTE [kill inside a collective]).
using inject_kill_atom = caf::atom_constant<caf::atom("injkill")>;
/// Driver → a trainer's DP rank in a worker: (n) block for good inside the
/// n-th operation of its DP group from now on, the process running on
/// (NOTE [deadlocked collectives] in cluster/heartbeats.hpp).
using inject_hang_atom = caf::atom_constant<caf::atom("injhang")>;

class kill_switch {
public:
  void arm(bool whole_process) {
    armed_ = true;
    whole_process_ = whole_process;
  }
  bool armed() const { return armed_; }
  /// When armed: ends the process (never returns) or makes `self` quit
  /// with exit reason kill and answers true — the caller then answers
  /// nothing. False when not armed.
  bool fire(caf::scheduled_actor* self);

  /// NOTE [kill inside a collective]: the hook a DP group runs before the
  /// operation the rank dies in: it ends the process (whole_process), or
  /// marks this switch and throws, failing the request that made the call.
  std::function<void()> dying_hook(bool whole_process);
  /// The hook a DP group runs before the operation the rank hangs in: it
  /// never returns (the heartbeats find the deadlock and kill the process).
  static std::function<void()> hanging_hook();
  /// After a request: when the dying hook fired in it, makes `self` quit
  /// with exit reason kill and answers true (the caller answers nothing).
  bool fired_inside(caf::scheduled_actor* self);

private:
  bool armed_ = false;
  bool whole_process_ = false;
  std::shared_ptr<bool> died_inside_ = std::make_shared<bool>(false);
};

} // namespace troupe::actors
