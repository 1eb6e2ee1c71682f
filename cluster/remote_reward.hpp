#pragma once
// The reward backend of rl.reward.kind remote: a client of a RewardService
// (proto/troupe/v1/reward.proto).
//
// NOTE [remote reward]
// score() decodes each sample (the prompt as the model saw it, the response
// cut at EOS with special tokens skipped), cuts the batch into calls of
// remote.batch_size samples and keeps up to remote.max_in_flight of them in
// flight at once, each bounded by remote.timeout_s. A call that fails as
// unavailable, timed out, overloaded (RESOURCE_EXHAUSTED) or aborted is tried
// again after remote.backoff_s · 2^(k-1) seconds, up to remote.retries more
// times; any other failure (UNAUTHENTICATED, INVALID_ARGUMENT, ...) and a
// malformed answer (a score count or a token-score length that does not match)
// fail at once. The error names the service, the call and the attempts; the
// driver adds the phase ("rl iteration 3, phase reward: reward: score: reward
// service 127.0.0.1:5001: call 2 of 4 (64 samples): UNAVAILABLE: ... after 4
// attempts"). Nothing waits unbounded: the whole score() ends within
// (retries + 1) · timeout_s plus the backoffs, per wave of calls.
// A reward service is a peer troupe does not control, so an answer is
// checked before any of it is used: every score and token score finite
// in fp32 (what troupe keeps them in: a double of 1e300 is not),
// and the named extras (they become metric names, reward/extra/<name>, in
// the log, Prometheus and the dashboard) at most max_reward_extras names in
// one score() call, each a name runtime::peer_metric_name_why accepts (1 to
// 64 bytes of letters, digits and `_ . - /`), its value finite in fp32. The size of an answer is
// bounded by gRPC's limit on a received message (4 MB). The channel is TLS when remote.ca_file is
// set and clear text only to a loopback address (open_channel); the bearer token is read from
// remote.token_file once, when the backend is made.

#include "actors/rl/reward_backend.hpp"
#include "actors/rl/roles.hpp"

#include <memory>
#include <string>
#include <string_view>

namespace troupe::actors::rl {
struct remote_service_config;
} // namespace troupe::actors::rl

namespace troupe::cluster {

/// Bounds on a reward service's named extras (NOTE [remote reward]).
inline constexpr size_t max_reward_extras = 32;

/// A RewardService client for the job `job` (its name goes to the server).
expected<std::unique_ptr<actors::rl::reward_backend>>
make_remote_reward(const actors::rl::remote_service_config& c,
                   std::shared_ptr<const models::tokenizer> tok, std::string job);

/// The role factories troupe's own processes use (the driver's in-process
/// host, the worker's role host): the built-in parts plus the remote reward
/// and the remote environment (cluster/remote_environment.hpp) and the
/// agent endpoint (cluster/agent_host.hpp).
actors::rl::role_factories process_factories();

} // namespace troupe::cluster
