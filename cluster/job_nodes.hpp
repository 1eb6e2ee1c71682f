#pragma once
// What the controller and a job's driver tell each other when the job's
// workers run on node agents, and what an agent is asked to start.
//
// NOTE [remote workers]: for a job placed on nodes (NOTE [nodes of a plan]
// in actors/rl/placement.hpp), the controller picks a ready node for each
// node of the plan, reserves its devices and writes <job dir>/nodes.json
// (the address the driver listens on, each node's name and address) before
// it starts the driver with --nodes. The driver publishes its registrar on
// that address and tells the controller, over the driver link (NOTE [driver
// link] in driver_link.hpp), which workers it waits for (its pid, the
// registrar's address, its working directory, one entry per worker: rank,
// node, label); the controller checks the request and sends each node's
// agent a StartWorker per worker of that node. The agent checks the request, builds the argv itself
// (`troupe worker` and nothing else, no shell) and reports every exit. The
// workers register as local ones do (NOTE [worker lifecycle] in
// workers.hpp). When the job ends, however it ends, the controller sends
// StopJob to each of its nodes, and the agents kill what is left of it.
// Agents kill their workers when they stop, and a worker dies with its
// agent (PR_SET_PDEATHSIG), so no process of a job outlives its node's
// agent either.

#include "runtime/error.hpp"

#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace troupe::cluster {

inline constexpr const char* nodes_file = "nodes.json";

struct job_node {
  std::string name;
  /// Where the node's processes are reached (its advertised address).
  std::string host;
};

/// nodes.json: the controller's choice of nodes for a job.
struct job_nodes {
  /// The address the driver listens on (reached from every node).
  std::string bind_host;
  /// Node i of the plan is nodes[i].
  std::vector<job_node> nodes;
};

expected<void> write_job_nodes(const std::string& job_dir, const job_nodes& n);
expected<job_nodes> read_job_nodes(const std::string& job_dir);

struct worker_entry {
  int32_t rank = 0;
  /// The plan's node (an index into job_nodes::nodes).
  int64_t node = 0;
  /// "pool:role+role".
  std::string label;
  /// Every role of the worker may be restarted (NOTE [supervision] in
  /// actors/rl/supervision.hpp): a lost node is then the driver's to
  /// recover from (NOTE [replacing a worker]), not the job's end.
  bool restartable = false;
};

/// The workers a driver waits for (a message on the driver link).
struct worker_request_file {
  int64_t pid = 0;
  /// The registrar, HOST:PORT.
  std::string driver;
  /// The driver's working directory (relative paths of the job resolve there).
  std::string cwd;
  int64_t timeout_ms = 30000;
  std::vector<worker_entry> workers;
};

/// Refuses a request whose workers are not ranked 0, 1, ... in order.
expected<void> check_worker_requests(const worker_request_file& w);

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_entry& x) {
  return f(caf::meta::type_name("worker_entry"), x.rank, x.node, x.label, x.restartable);
}

/// NOTE [replacing a worker]: a driver whose worker on a node was lost
/// asks the controller, over the driver link, for that worker again
/// (its worker_entry). The controller starts it on the node its plan node
/// runs on when that node is still ready (the process died, the node
/// lives), else on another ready node with the plan node's devices free,
/// which then plays that plan node for the rest of the job. While no node
/// has room, the job waits — running, with the reason in its status
/// (`waiting:`) — and the controller tries again whenever a node joins.
/// The answer names the node (or says why it cannot be had), and the
/// driver waits for the new worker to register. Fencing: the new worker's
/// roles rendezvous under a new generation's prefix, and an old worker
/// cut off from the driver exits when it sees the driver's connection go.
/// A node asked for a worker whose old process has not ended yet (told to
/// end, it is slow to on a loaded node) gives it 10 s, then kills it, and
/// starts the new one (worker_table::retire_previous, cluster/worker_table.cpp).
struct worker_replaced {
  int32_t rank = 0;
  /// The node it was started on: its name and address.
  std::string node;
  std::string host;
  /// Non-empty: it was not started, and why.
  std::string error;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_replaced& x) {
  return f(caf::meta::type_name("worker_replaced"), x.rank, x.node, x.host, x.error);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, worker_request_file& x) {
  return f(caf::meta::type_name("worker_request"), x.pid, x.driver, x.cwd, x.timeout_ms, x.workers);
}

/// One StartWorker, as an agent receives it.
struct worker_start {
  std::string job_id;
  int32_t rank = 0;
  int32_t world = 1;
  std::string label;
  std::string driver;
  std::string cwd;
  int64_t timeout_ms = 30000;
};

/// One WorkerExited, as the controller receives it.
struct worker_exit {
  std::string job_id;
  int32_t rank = 0;
  int64_t pid = 0;
  int32_t code = -1;
  int32_t signal = 0;
  std::string description;
  std::string output_tail;
};

/// One StopJob: end every process of the job on the node.
struct job_stop {
  std::string job_id;
  std::string reason;
};

/// What the controller sends a node's agent after its welcome.
using node_command = std::variant<worker_start, job_stop>;

/// Whether a request from the wire may be run: a job id and label of
/// harmless characters, a HOST:PORT driver, rank < world, an absolute
/// working directory. The error names the field.
expected<void> check_worker_start(const worker_start& s);

/// The worker's argv: `<executable> worker --driver ... --rank ...`.
std::vector<std::string> worker_argv(const std::string& executable, const worker_start& s);

/// Whether `id` may name a job on the wire: [A-Za-z0-9._-]{1,64}.
bool valid_job_id(std::string_view id);

} // namespace troupe::cluster
