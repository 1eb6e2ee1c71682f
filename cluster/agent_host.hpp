#pragma once
// The job side of the OpenAI-compatible endpoint: an iteration's gateway
// over the rollout and the agent's process (NOTE [agent runs] in
// actors/rl/agent_runs.hpp).

#include "actors/rl/agent_runs.hpp"

#include <caf/fwd.hpp>

#include <memory>
#include <string>

namespace troupe::cluster {

/// Starts the endpoint of `spec`'s rl.agent (its listen address and TLS,
/// a fresh random key) over `rollout`, recording in `book`.
expected<std::unique_ptr<actors::rl::agent_host>>
make_agent_host(caf::actor_system& sys, caf::actor rollout,
                std::shared_ptr<actors::rl::agent_book> book,
                const actors::rl::agent_endpoint_spec& spec);

/// The program argv[0] names: itself when it has a slash, else the first
/// executable of that name on PATH (not_found otherwise).
expected<std::string> find_program(const std::string& name);

} // namespace troupe::cluster
