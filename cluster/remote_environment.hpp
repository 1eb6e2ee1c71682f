#pragma once
// The environment of rl.environment.kind remote: a client of an
// EnvironmentService (proto/troupe/v1/environment.proto).
//
// NOTE [remote environment]: reset cuts its sessions into calls of
// remote.batch_size and keeps up to remote.max_in_flight in flight; step
// sends the turns it is given (the episode runner sends one at a time, from
// many threads at once); each call is bounded by remote.timeout_s and
// retried as a reward service's is (NOTE [remote reward]). An answer is a
// peer's: its number of results and their sessions are checked here, each
// tool spec must parse as JSON, and the runner checks the rest (rewards and
// info finite in fp32, info names, observations) before anything is used
// (NOTE [episodes]). close is one call without retries, its failure
// ignored: the server also ends a session when Step answers done. Errors
// name the service and the call ("environment service 127.0.0.1:5002:
// step: UNAVAILABLE: ... after 4 attempts"); the runner adds the session
// and the phase. TLS and the bearer token as for the reward service.

#include "actors/rl/environment.hpp"

#include <memory>
#include <string>

namespace troupe::actors::rl {
struct remote_service_config;
} // namespace troupe::actors::rl

namespace troupe::cluster {

/// An EnvironmentService client for the job `job` (its name goes to the
/// server).
expected<std::unique_ptr<actors::rl::environment>>
make_remote_environment(const actors::rl::remote_service_config& c, std::string job);

} // namespace troupe::cluster
