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
//
// NOTE [batches ahead]: requests generated ahead (generate with ahead_atom)
// are queued and answered at once with their count; they run with the rest,
// and each waits, finished, until a `collect` call names it, which answers
// when every one it names has finished. A `snapshot` holds them — the
// finished ones' outputs and the engine's requests (NOTE [engine snapshot])
// — and `restore` puts a snapshot back into a rollout that holds no
// requests, so a checkpoint keeps the samples in flight.
//
// NOTE [paced rollout]: with rollout_options::pace N > 0 the actor's steps
// are a function of the messages it receives, never of their timing. A
// generate ahead lets it run N steps; a generate or collect call, until it
// is answered; otherwise it waits. A message that changes what runs
// (generate, generate ahead, collect, a weight version, cache clear,
// release, snapshot, restore) that arrives while it may still step is held,
// and applied, in arrival order, once it may not: so a weight version loads
// exactly N steps after the batch ahead that came before it (or at once if
// the engine ran out of work first), whatever the time the trainer took.
// This is in-flight updates made reproducible (rl.inflight_steps): with the
// batch-invariant kernels, a run and its resumption from a checkpoint
// (which takes the snapshot at such a point) sample the same tokens under
// the same versions.

#include "actors/inference/engine.hpp"
#include "actors/kill_switch.hpp"
#include "actors/weight_channel.hpp"

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
using drive_atom = caf::atom_constant<caf::atom("drive")>;
using ahead_atom = caf::atom_constant<caf::atom("ahead")>;
using collect_atom = caf::atom_constant<caf::atom("collect")>;
using snapshot_atom = caf::atom_constant<caf::atom("snapshot")>;
using restore_atom = caf::atom_constant<caf::atom("restore")>;

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
    /// Queues requests to be collected later (NOTE [batches ahead]);
    /// answers how many.
    caf::replies_to<generate_atom, ahead_atom, std::vector<generate_request>>::with<int64_t>,
    /// The outputs of requests generated ahead, in this order, once all
    /// have finished.
    caf::replies_to<collect_atom, std::vector<std::string>>::with<generation>,
    /// The requests generated ahead and not yet collected, as bytes.
    caf::replies_to<snapshot_atom>::with<std::string>,
    /// Puts a snapshot back (the rollout holds no requests); answers the
    /// ids it holds now.
    caf::replies_to<restore_atom, std::string>::with<std::vector<std::string>>,
    /// Loads weight version v between steps; answers v.
    caf::replies_to<load_weights_atom, int64_t, shared_weights>::with<int64_t>,
    /// Receives version v from the channel (opened on first use and kept),
    /// loads it between steps and lets go of the received buffers; answers
    /// the bytes received and the temporary bytes held (NOTE [sync staging]).
    caf::replies_to<receive_weights_atom, int64_t, weight_channel>::with<sync_bytes>,
    caf::replies_to<metrics_atom>::with<engine_metrics>,
    /// Drops the prefix cache (e.g. after an evaluation, so the next batch
    /// computes exactly as it would have without it); answers free blocks.
    caf::replies_to<clear_cache_atom>::with<int64_t>,
    /// Frees the KV pool until the next generate (co-located offload);
    /// answers the bytes freed.
    caf::replies_to<release_atom>::with<int64_t>,
    /// Runs one engine step now; answers whether work remains. A driven
    /// rank (a tensor-parallel rollout group's, NOTE [rollout group]) steps
    /// only so.
    caf::replies_to<drive_atom>::with<bool>,
    /// Internal: runs one engine step.
    caf::reacts_to<step_atom>,
    /// NOTE [kill injection] (actors/kill_switch.hpp); a group or fleet
    /// passes it to its first member.
    caf::reacts_to<inject_kill_atom, bool>>;

struct rollout_options {
  /// Steps only when told (drive_atom), never on its own.
  bool driven = false;
  /// Steps after each generate ahead (NOTE [paced rollout]); 0 = steps
  /// while there is work.
  int64_t pace = 0;
  /// The actor's compute threads (its fused decode team, its ATen ops);
  /// 0 = the process's setting.
  int threads = 0;
  /// Held while the actor lives: what its model refers to and does not
  /// own (a TP rank's process groups).
  std::shared_ptr<const void> keep_alive;
};

/// Builds the engine (validating `config` against the model) and spawns its
/// detached actor. The actor owns the model from now on.
expected<rollout_actor> spawn_rollout(caf::actor_system& sys, models::llama_model model,
                                      const engine_config& config, rollout_options options = {});

/// The engine's metrics under the job's metric names ("rollout/...").
std::vector<std::pair<std::string, double>> rollout_metrics(const engine_metrics& m);

} // namespace troupe::actors::inference
