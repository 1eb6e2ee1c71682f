#pragma once
// A training engine as a detached CAF actor (its work is blocking LibTorch
// compute): the policy, critic, reference and reward-model roles are each one
// of these. Every failure comes back to the caller as an error prefixed with
// the role's name and the request ("critic: update_critic: ..."); a handler
// that throws ends the actor, and callers see that error or, at worst, their
// own timeout — never a hang.

#include "actors/kill_switch.hpp"
#include "actors/train/served.hpp"
#include "actors/train/train_engine.hpp"
#include "actors/weight_channel.hpp"

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/fwd.hpp>
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <memory>
#include <string>
#include <vector>

namespace troupe::actors::train {

using log_probs_atom = caf::atom_constant<caf::atom("logprobs")>;
using values_atom = caf::atom_constant<caf::atom("values")>;
using scores_atom = caf::atom_constant<caf::atom("scores")>;
using update_policy_atom = caf::atom_constant<caf::atom("updpolicy")>;
using update_critic_atom = caf::atom_constant<caf::atom("updcritic")>;
using sft_step_atom = caf::atom_constant<caf::atom("sftstep")>;
using rm_step_atom = caf::atom_constant<caf::atom("rmstep")>;
using rm_eval_atom = caf::atom_constant<caf::atom("rmeval")>;
using dpo_step_atom = caf::atom_constant<caf::atom("dpostep")>;
using export_atom = caf::atom_constant<caf::atom("export")>;
using publish_atom = caf::atom_constant<caf::atom("publish")>;
using save_model_atom = caf::atom_constant<caf::atom("savemodel")>;
using gather_weights_atom = caf::atom_constant<caf::atom("gatherw")>;
using save_state_atom = caf::atom_constant<caf::atom("savestate")>;
using load_state_atom = caf::atom_constant<caf::atom("loadstate")>;
using save_shards_atom = caf::atom_constant<caf::atom("saveshards")>;
using load_shards_atom = caf::atom_constant<caf::atom("loadshards")>;
/// NOTE [peer state]: a DP rank's training state for a restarted peer.
using peer_state_atom = caf::atom_constant<caf::atom("peerstate")>;
/// Testing: the next request of any kind fails by throwing (an actor crash).
using inject_failure_atom = caf::atom_constant<caf::atom("injfail")>;

/// NOTE [sharded state]: every rank's shard of a training state, in rank
/// order (a type of its own: it crosses processes).
struct state_shards {
  std::vector<std::string> shards;
  /// The tensor- and pipeline-parallel sizes of the ranks that saved them
  /// (NOTE [tensor-parallel dispatch]: shard i holds the parts of position
  /// i % (tp · pp) of a replica).
  int32_t tp = 1, pp = 1;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, state_shards& x) {
  return f(caf::meta::type_name("state_shards"), x.shards, x.tp, x.pp);
}

/// The requests of an RL step answer served<T> (NOTE [busy on replies]).
using served_batch = served<runtime::tensor_batch>;
using served_metrics = served<metric_map>;
using served_bytes = served<int64_t>;
using served_sync = served<actors::sync_bytes>;

using engine_actor = caf::typed_actor<
    caf::replies_to<log_probs_atom, runtime::tensor_batch, double, bool>::with<served_batch>,
    caf::replies_to<values_atom, runtime::tensor_batch>::with<served_batch>,
    caf::replies_to<scores_atom, runtime::tensor_batch>::with<served_batch>,
    caf::replies_to<update_policy_atom, runtime::tensor_batch,
                    policy_update_options>::with<served_metrics>,
    caf::replies_to<update_critic_atom, runtime::tensor_batch,
                    critic_update_options>::with<served_metrics>,
    caf::replies_to<sft_step_atom, runtime::tensor_batch>::with<metric_map>,
    caf::replies_to<rm_step_atom, runtime::tensor_batch>::with<metric_map>,
    caf::replies_to<rm_eval_atom, runtime::tensor_batch>::with<metric_map>,
    caf::replies_to<dpo_step_atom, runtime::tensor_batch, dpo_step_options>::with<metric_map>,
    /// The weights under HF names (for the rollout's load_weights).
    caf::replies_to<export_atom>::with<actors::shared_weights>,
    /// Publishes the model's weights (HF names) as version v on the channel
    /// (opened on first use and kept); answers the bytes published and the
    /// temporary bytes it took (NOTE [sync staging]).
    caf::replies_to<publish_atom, int64_t, actors::weight_channel>::with<served_sync>,
    /// Writes the model as a HF directory; answers the directory.
    caf::replies_to<save_model_atom, std::string>::with<std::string>,
    /// Makes the weights whole and frees them again, exporting nothing: a
    /// zero3 rank's part in another rank's export, publish or save_model
    /// (NOTE [dispatch modes] in engine_group.hpp); answers the bytes.
    caf::replies_to<gather_weights_atom>::with<int64_t>,
    /// Training state as bytes, and back.
    caf::replies_to<save_state_atom>::with<std::string>,
    caf::replies_to<load_state_atom, std::string>::with<int64_t>,
    /// NOTE [sharded state]: each rank's shard of the training state (no
    /// rank gathers), in rank order; and a state from such shards, written
    /// under any DP size and strategy (answers the step count).
    caf::replies_to<save_shards_atom>::with<state_shards>,
    caf::replies_to<load_shards_atom, state_shards>::with<int64_t>,
    /// NOTE [peer state]: the training state (save_state's bytes) — with
    /// true, as it was before the last update (train_engine::
    /// state_before_update) — for a restarted peer of this rank's group.
    caf::replies_to<peer_state_atom, bool>::with<std::string>,
    /// Co-located offload to a file in the folder, until next needed: a
    /// trainer's optimizer state (gradients freed), a frozen model's
    /// weights; answers the bytes freed.
    caf::replies_to<actors::release_atom, std::string>::with<served_bytes>,
    caf::reacts_to<inject_failure_atom>,
    /// NOTE [kill injection] (actors/kill_switch.hpp).
    caf::reacts_to<actors::inject_kill_atom, bool>,
    /// NOTE [kill inside a collective]: dies at the n-th operation of its
    /// DP group from now on (at its next request when it is in none).
    caf::reacts_to<actors::inject_kill_atom, bool, int64_t>,
    /// NOTE [deadlocked collectives]: blocks for good inside the n-th
    /// operation of its DP group from now on (a rank in a worker).
    caf::reacts_to<actors::inject_hang_atom, int64_t>>;

/// Co-located offload of `e` to a file in `dir` named after `role` (the
/// release message of the engine and reward actors): a trainer's optimizer
/// state (gradients freed), a frozen model's weights; freed heap memory goes
/// back to the system. Answers the bytes freed.
expected<int64_t> release_engine(train_engine& e, const std::string& dir, const std::string& role);

/// Spawns `engine` as the detached actor of role `role`.
engine_actor spawn_engine_actor(caf::actor_system& sys, std::string role,
                                std::unique_ptr<train_engine> engine);

} // namespace troupe::actors::train

