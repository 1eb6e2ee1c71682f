#pragma once
// A tensor-parallel rollout, or a fleet of rollout replicas, behind one
// rollout_actor handle.
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

#include <utility>
#include <vector>

namespace troupe::actors::inference {

/// The group of `ranks` (TP rank order; each spawned driven). Needs at
/// least one rank.
expected<rollout_actor> spawn_rollout_group(caf::actor_system& sys,
                                            std::vector<rollout_actor> ranks);

// NOTE [rollout fleet]: the rollout's dp replicas — independent engines
// (or TP groups), each with the whole model — behind one rollout_actor
// handle. A generate call is split by request index into contiguous
// slices, one per replica (fleet_slice: the first n % dp replicas take one
// more), so the split is a function of the call alone; each replica
// generates its slice with the requests' own seeds, and the fleet answers
// the outputs in request order. A request that `extends` an earlier one
// goes to the replica that generated it (that replica holds its sequence).
// In the batch-invariant mode a request's tokens do not depend on what it
// is batched with, so a fleet generates what one engine does, bit for bit.
// Weight versions, cache clears and releases reach every replica (a
// one-receiver channel is refused, as for the TP group); the answer's
// engine counters are the replicas' sums (busy seconds: the largest, as
// the replicas run side by side). A replica that ends ends the fleet, and
// the fleet's end ends its replicas.

/// The requests [first, last) of `n` that replica `r` of `dp` generates.
std::pair<size_t, size_t> fleet_slice(size_t n, size_t dp, size_t r);

/// The fleet of `replicas` (each a rollout actor stepping on its own, or a
/// TP group). Needs at least one.
expected<rollout_actor> spawn_rollout_fleet(caf::actor_system& sys,
                                            std::vector<rollout_actor> replicas);

/// The fleet's counters: the replicas' sums (NOTE [rollout fleet]).
engine_metrics combined_metrics(const std::vector<engine_metrics>& parts);

} // namespace troupe::actors::inference
