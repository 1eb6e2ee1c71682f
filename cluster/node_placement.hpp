#pragma once
// Which ready node plays each node of a job's plan (NOTE [nodes of a plan]
// in actors/rl/placement.hpp, NOTE [remote workers] in job_nodes.hpp).
//
// NOTE [node slots]: a node offers one device per GPU, or on a machine
// without GPUs one per core (a CPU device is a worker process). A job
// holds the devices it placed on a node from its admission until its
// driver ends; the controller admits the head of its queue only when every
// node of its plan finds a distinct ready node with that many free
// devices, so a job is never half-started, and it waits (queued, with the
// reason) while they are missing.

#include "cluster/node_registry.hpp"

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace troupe::cluster {

/// Devices a node offers (NOTE [node slots]).
int64_t device_slots(const node_resources& r);

/// The ready node for each node of a plan, by index: `need[i]` devices on
/// node i, `used` devices already held per node name. Fails with why (the
/// plan's needs and each ready node's free devices) when they do not fit.
expected<std::vector<std::string>> assign_nodes(const std::vector<int64_t>& need,
                                                const std::vector<node_view>& nodes,
                                                const std::map<std::string, int64_t>& used);

/// NOTE [replacing a worker] in job_nodes.hpp: the node that plays node
/// `index` of a running job's plan (`job_nodes`, `need` devices each) when
/// a worker there is asked for again: the node that played it while it is
/// ready, else a ready node the job does not use with the devices free
/// (`used`: the devices other jobs hold, per node). Fails with why none
/// fits.
expected<std::string> replacement_node(const std::vector<std::string>& job_nodes,
                                       const std::vector<int64_t>& need, size_t index,
                                       const std::vector<node_view>& nodes,
                                       const std::map<std::string, int64_t>& used);

} // namespace troupe::cluster
