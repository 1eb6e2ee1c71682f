#pragma once
// The driver's handle on a data-parallel role: one actor with the engine
// actor's interface in front of the role's DP ranks (each an engine actor
// in a group built by train_engine::join_data_parallel).
//
// NOTE [dispatch modes]: each request goes to the ranks in one of three ways:
//   split      the batch's rows are divided over the ranks and the answers
//              gathered (log_probs, values, scores: concatenated in rank
//              order; sft_step, rm_step: the metrics, which the ranks
//              reduce among themselves);
//   minibatch  update_policy / update_critic: the group draws the same
//              minibatches a single engine would (make_minibatches), gives
//              rank r the r-th slice of each one in order and asks it to
//              step through them unshuffled;
//   all        load_state and save_state go to every rank (a sharded
//              strategy gathers its optimizer state to save it: NOTE
//              [training strategies]; rank 0's bytes are the answer);
//   rank 0     rm_eval, export, publish, save_model and injected failures
//              (every rank holds the whole weights after a step); under
//              zero3 the ranks gather the weights together, so the others
//              make the same passes alongside (rm_eval the same batch, an
//              export for the rest) and only rank 0's answer is kept.
// Under zero3 every split request needs a row for every rank.
// NOTE [tensor-parallel dispatch]: with tp or pp > 1 the ranks are a {dp,
// pp, tp} mesh (rank = (d · pp + p) · tp + t): a replica is tp · pp
// consecutive ranks, the rows are divided over the dp replicas and every
// rank of replica d gets replica d's rows (its ranks compute one model
// together: the TP ranks a layer's parts, the PP ranks its stages); the
// answers of each replica's first rank are the replica's (a pipeline's
// stages all answer the last stage's result). A replica exports, publishes
// and saves together (each rank gathers its parts with the others', each
// stage sends the first its tensors), so rank 0's answers need every rank
// alongside, as under zero3.
// The first error of any rank is the answer; a rank that goes down ends the
// group with it. Ending the group ends its ranks.

#include "actors/train/dp_strategy.hpp"
#include "actors/train/engine_actor.hpp"

#include <string>
#include <vector>

namespace troupe::actors::train {

/// Spawns the group actor of `ranks` (at least one) for role `role`, whose
/// ranks train under `strategy`, tp · pp consecutive ranks a replica of
/// `pp` stages of `tp` tensor-parallel ranks each (NOTE [tensor-parallel
/// dispatch]; tp · pp divides the ranks).
engine_actor spawn_engine_group(caf::actor_system& sys, std::string role,
                                std::vector<engine_actor> ranks,
                                dp_strategy strategy = dp_strategy::ddp, int tp = 1, int pp = 1);

} // namespace troupe::actors::train
