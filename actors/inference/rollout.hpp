#pragma once
// The rollout actor: the inference engine as a CAF actor, the rollout role's
// engine. It runs detached (engine steps are blocking LibTorch compute) and
// drives the engine one step per message, so requests from any number of
// callers join the running batch between steps (continuous batching across
// callers), and weight updates and metrics queries are served between steps.
//
// NOTE [rollout actor loop]: a `generate` call validates and queues all its
// requests (all or none) and answers when the last of them finishes; while
// the engine has work the actor sends itself `step` after each step, so every
// message that arrived meanwhile is handled before the next step. A failing
// step fails every open call with the error (prefixed "rollout step") and
// the actor quits with it, so monitors see it at once: no caller waits on a
// dead engine.

#include "actors/inference/engine.hpp"
#include "runtime/weight_transport.hpp"

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace troupe::actors::inference {

using generate_atom = caf::atom_constant<caf::atom("generate")>;
using load_weights_atom = caf::atom_constant<caf::atom("loadweight")>;
using metrics_atom = caf::atom_constant<caf::atom("metrics")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using clear_cache_atom = caf::atom_constant<caf::atom("clearcache")>;
using receive_weights_atom = caf::atom_constant<caf::atom("recvweight")>;
/// Co-located offload: free what an idle role need not hold (the rollout's
/// KV pool; a trainer's optimizer state and gradients, to disk).
using release_atom = caf::atom_constant<caf::atom("release")>;

/// Where versions of a trainer's weights travel to a rollout: the transport
/// (runtime/weight_transport.hpp) both sides open. Plain data, so it can be
/// sent to roles in other processes.
struct weight_channel {
  /// alias | shm | disk | broadcast.
  std::string kind = "alias";
  /// Unique per job and pair of roles.
  std::string channel = "weights";
  /// disk: the folder of the versions.
  std::string dir;
  int64_t keep = 2;
  int64_t timeout_ms = 30000;
  /// broadcast: "host:port" of the TCPStore where the publisher (rank 0)
  /// and the receiver (rank 1) form their two-rank gloo group.
  std::string store;
  /// broadcast: the addresses the publisher's and the receiver's processes
  /// bind their gloo pairs to (their nodes' addresses).
  std::string publisher_host = "127.0.0.1";
  std::string receiver_host = "127.0.0.1";
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, weight_channel& x) {
  return f(caf::meta::type_name("weight_channel"), x.kind, x.channel, x.dir, x.keep,
           x.timeout_ms, x.store, x.publisher_host, x.receiver_host);
}

/// The transport options of `c` (runtime/weight_transport.hpp).
runtime::transport_options transport_options_of(const weight_channel& c);

/// The transports an actor has opened, by kind and channel, with the
/// process groups of its broadcast channels (declared first: they outlive
/// the transports that use them).
struct transport_cache {
  std::map<std::string, std::shared_ptr<void>> groups;
  std::map<std::string, std::unique_ptr<runtime::weight_transport>> transports;
};

/// Which end of a channel an actor is (broadcast: its rank in the group).
enum class channel_side { publisher = 0, receiver = 1 };

/// The transport for `c` in `cache`, opened on first use (broadcast: joins
/// the channel's two-rank group, which blocks until the other side joins).
expected<runtime::weight_transport*> open_channel(transport_cache& cache, const weight_channel& c,
                                                  channel_side side);

/// Weights by HF name, shared read-only (the in-process alias transport:
/// the sender must not modify the tensors until the update is answered).
using shared_weights = std::shared_ptr<const std::map<std::string, at::Tensor>>;

/// The answer to a generate request: the outputs in request order, and the
/// engine's counters when it answered (NOTE [busy on replies]: the driver
/// reads a step's rollout work from consecutive answers).
struct generation {
  std::vector<request_output> outputs;
  engine_metrics engine;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generation& x) {
  return f(caf::meta::type_name("generation"), x.outputs, x.engine);
}

using rollout_actor = caf::typed_actor<
    /// Generates to completion.
    caf::replies_to<generate_atom, std::vector<generate_request>>::with<generation>,
    /// Loads weight version v between steps; answers v.
    caf::replies_to<load_weights_atom, int64_t, shared_weights>::with<int64_t>,
    /// Receives version v from the channel (opened on first use and kept),
    /// loads it between steps and lets go of the received buffers; answers
    /// the bytes received.
    caf::replies_to<receive_weights_atom, int64_t, weight_channel>::with<int64_t>,
    caf::replies_to<metrics_atom>::with<engine_metrics>,
    /// Drops the prefix cache (e.g. after an evaluation, so the next batch
    /// computes exactly as it would have without it); answers free blocks.
    caf::replies_to<clear_cache_atom>::with<int64_t>,
    /// Frees the KV pool until the next generate (co-located offload);
    /// answers the bytes freed.
    caf::replies_to<release_atom>::with<int64_t>,
    /// Internal: runs one engine step.
    caf::reacts_to<step_atom>>;

/// Builds the engine (validating `config` against the model) and spawns its
/// detached actor. The actor owns the model from now on.
expected<rollout_actor> spawn_rollout(caf::actor_system& sys, models::llama_model model,
                                      const engine_config& config);

/// The engine's metrics under the job's metric names ("rollout/...").
std::vector<std::pair<std::string, double>> rollout_metrics(const engine_metrics& m);

} // namespace troupe::actors::inference

// In-process only: weights by reference (the alias channel). Other
// processes get weights through the transports (receive_weights_atom).
// Caution: CAF skips such a type without a word when it serialises a
// message, so every other message type has an inspect and is registered in
// actors::configure.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::inference::shared_weights)
