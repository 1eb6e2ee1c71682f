#pragma once
// A local stand-in for a role actor in another process.
//
// NOTE [role proxy]: a request to a remote actor whose process dies waits
// for its timeout in CAF (nothing answers it). The driver therefore talks to
// remote roles through a proxy in its own process: the proxy forwards each
// message (requests as requests, with their answers relayed back: the
// answer types of the role interfaces are listed in role_proxy.cpp), monitors
// the remote actor and, when it goes down, fails every request still open
// with an error naming the role and where it ran (errc::lost: NOTE
// [supervision] in actors/rl/supervision.hpp), and answers every later
// request with it. Ending the proxy (an exit message from the driver) ends
// the remote actor. Roles in the driver's own process sit behind one too:
// CAF 0.17 answers nothing for a request a local actor held when it ended.

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <string>

namespace troupe::actors {

/// Spawns the proxy of `target`; `name` says which role and where, e.g.
/// "policy (worker 1, pid 4242)".
caf::actor spawn_role_proxy(caf::actor_system& sys, caf::actor target, std::string name);

} // namespace troupe::actors
