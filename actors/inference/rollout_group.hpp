#pragma once
// A tensor-parallel rollout behind one rollout_actor handle.
//
// NOTE [rollout group]: the ranks of a TP rollout are rollout actors, each
// an engine on its rank's part of the model (NOTE [tensor-parallel decode]
// in models/llama.cpp). Their steps meet in the TP group's collectives, so
// every rank must run the same steps over the same batches. The ranks are
// therefore driven (rollout_options::driven: they never step on their own)
// and the group is their only caller: it forwards each message to every
// rank in the order it arrives and steps them together — drive to all, all
// answers, drive again while work remains (or while requests were
// forwarded after the round went out: its "no work" answers may predate
// them). CAF keeps one sender's messages
// to one receiver in order, so every rank sees the same requests between
// the same steps, and its scheduler (deterministic given that sequence:
// the same admissions, KV blocks, preemptions) forms the same batches.
// Each rank samples from the whole logits (gathered across the group) with
// the request's seed, so the ranks' tokens are equal: the group checks that
// they are and answers rank 0's outputs (a difference is an error naming
// the request, never a silent pick). A weight version reaches every rank:
// each receives the whole weights from the channel and keeps its part, so
// nothing larger than the rank's part is copied per rank (alias, shm and
// disk serve several receivers; the broadcast channel serves one and is
// refused). A rank that ends ends the group with its reason, and the
// group's end ends its ranks.

#include "actors/inference/rollout.hpp"

#include <caf/fwd.hpp>

#include <vector>

namespace troupe::actors::inference {

/// The group of `ranks` (TP rank order; each spawned driven). Needs at
/// least one rank.
expected<rollout_actor> spawn_rollout_group(caf::actor_system& sys,
                                            std::vector<rollout_actor> ranks);

} // namespace troupe::actors::inference
