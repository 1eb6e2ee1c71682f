#pragma once
// `troupe node`: the agent that joins a machine to a controller (NOTE [node
// membership] in node_registry.hpp, docs/cluster.md). It holds one stream
// to the controller, reports the machine's resources, heartbeats, starts
// the job workers it is asked for, and comes back after a broken
// connection; a refusal (wrong secret, a name already joined) ends it.

#include "cluster/api_client.hpp"
#include "cluster/node_registry.hpp"

#include <csignal>
#include <string>

namespace troupe::cluster {

struct node_agent_options {
  /// The controller's address and TLS (its token is not used: agents
  /// authenticate with the cluster secret).
  client_options controller;
  std::string secret;
  /// "" = this host's name.
  std::string name;
  /// The address the driver and other nodes reach this node at ("" = the
  /// one the controller sees its connection come from).
  std::string advertise;
  node_resources resources;
  std::string version;
  /// How long to keep trying to reach the controller (at the start, and
  /// after a broken connection) before giving up.
  double reconnect_s = 60;
  /// Where workers' output goes: <work_dir>/jobs/<job id>/worker-<rank>.log.
  std::string work_dir;
  /// The troupe executable the workers run ("" = this one).
  std::string executable;
};

/// Exit statuses of run_node_agent.
inline constexpr int agent_exit_left = 0;
inline constexpr int agent_exit_refused = 2;
inline constexpr int agent_exit_unreachable = 3;

/// This machine as an agent reports it: cores of its CPU affinity, memory
/// (MemTotal, or the cgroup's limit when lower), GPUs (/dev/nvidiaN, or
/// those CUDA_VISIBLE_DEVICES lists).
node_resources detect_resources();

/// Runs the agent until one of `stop_signals` arrives (it leaves: 0), the
/// controller refuses it (agent_exit_refused) or stays unreachable for
/// reconnect_s (agent_exit_unreachable). Meanwhile it starts the workers
/// the controller asks for and reports their exits (NOTE [remote workers]
/// in job_nodes.hpp); it kills them all before it returns. The signals must
/// be blocked in every thread.
int run_node_agent(const node_agent_options& o, const sigset_t& stop_signals);

} // namespace troupe::cluster
