#pragma once
// The placement planner: which worker process (device) hosts which rank of
// which role, checked before anything starts (NOTE [placement modes] in
// job_config.hpp), with an estimate of each device's memory. `troupe plan`
// prints it; `troupe run` launches the workers it names.
//
// NOTE [nodes of a plan]: devices are numbered pool by pool (the pools in
// their order) and fill the job's resources.nodes in that order,
// devices_per_node each (0 = the devices divided by the nodes, rounded
// up): with pools train (2), gen (1) and judge (1) on two nodes, node 0
// holds the trainers and node 1 the rollout and the judges. Every node
// holds at least one device. Which machine plays node i is the
// controller's choice (cluster/node_placement.hpp); the local launcher
// runs one node.
//
// NOTE [weight transport choice]: the pair is the policy's rank 0 and the
// rollout. auto takes alias when they share a process, shm when they share
// a node, and across nodes disk when weight_sync.dir is set (a directory
// every node sees) or else broadcast. A forced choice that cannot work for
// the pair (alias across processes, shm across nodes, disk across nodes
// without a shared dir) is refused by make_plan, naming the pair.
//
// NOTE [memory estimate]: a trained role's rank holds NOTE [rank memory]'s
// terms (actors/train/strategy_memory.hpp: its states under its strategy,
// one micro-batch's activations, the strategy's transients), a frozen one
// (reference, reward model, rollout) its fp32 weights, the rollout its KV
// pool and packed decode weights. Stages run one after another and release
// their roles, so a device's peak is the largest stage total. A frozen
// role's no-grad passes are not counted.

#include "actors/rl/job_config.hpp"
#include "actors/rl/roles.hpp"
#include "actors/train/strategy_memory.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe::runtime {
class config_checks;
} // namespace troupe::runtime

namespace troupe::actors::rl {

/// NOTE [communication volume]: the bytes one rank of a trained role
/// receives per optimizer step along each dimension of its layout — the DP
/// gradient reduction (2 (DP − 1) / DP of its parameters' bytes, 3× that
/// under zero3), TP's all-reduces of the activations (2 (TP − 1) / TP of
/// (4 a block + 2) × tokens × hidden, forward and backward: Megatron's
/// count), and PP's activations and their gradients between stages (a
/// middle stage receives both, tokens × hidden each) — for the rows of
/// the largest optimizer step it takes. An estimate, not a measurement
/// (bench/bench_strategies measures them).
struct comm_volume {
  double dp = 0, tp = 0, pp = 0;
  double total() const { return dp + tp + pp; }
};

struct role_assignment {
  std::string role;
  std::string pool;
  /// NOTE [parallel layout] in roles.hpp.
  parallel_layout layout;
  /// Global device (worker) index of each rank.
  std::vector<int64_t> devices;
  /// How its DP ranks train (NOTE [training strategies]).
  train::dp_strategy strategy = train::dp_strategy::ddp;
  /// The dtype it computes in (NOTE [mixed precision]).
  train::precision compute = train::precision::fp32;
  /// Under pipeline parallelism: each stage's layers and the micro-batches
  /// a batch is cut into (NOTE [pipeline parallelism]).
  std::vector<int64_t> stage_layers;
  int64_t micro_batches = 0;
  /// A trained role's traffic a rank, a step (NOTE [communication volume]).
  comm_volume comm;
};

/// One rank's estimate in a stage, by term, largest first (NOTE [memory
/// estimate]).
struct rank_estimate {
  std::string rank; // e.g. "policy[dp 0]"
  double bytes = 0;
  std::vector<train::memory_term> terms;
};

struct device_plan {
  int64_t index = 0;
  std::string pool;
  /// The node (0 .. nodes-1) of the job that hosts it.
  int64_t node = 0;
  /// Role names with their ranks, e.g. "policy[dp 0]".
  std::vector<std::string> ranks;
  /// Estimated peak bytes (the largest stage).
  double peak_bytes = 0;
  /// The stage of the peak.
  std::string peak_stage;
  /// Its ranks' estimates in that stage.
  std::vector<rank_estimate> peak_ranks;
};

struct placement_plan {
  placement_mode mode = placement_mode::in_process;
  std::vector<role_assignment> roles;
  /// Empty for in_process (the driver's process only).
  std::vector<device_plan> devices;
  /// In-process: the driver's estimate, its stage and its roles' estimates.
  double driver_peak_bytes = 0;
  std::string driver_peak_stage;
  std::vector<rank_estimate> driver_peak_ranks;
  double device_memory_bytes = 0;
  /// Parameters of the policy model.
  int64_t parameters = 0;
  /// Nodes the devices fill (NOTE [nodes of a plan]).
  int64_t nodes = 1;
  /// How the policy's weights reach the rollout (none when the job has no
  /// rl stage; NOTE [weight transport choice]).
  std::optional<runtime::transport_kind> weight_transport;

  /// What the plan accepts but a user may not expect, with the YAML path
  /// (a ZeRO strategy with dp 1: nothing to shard).
  std::vector<std::string> warnings;
  /// The data files checked, a line each ("data.train_file: <path>: 1000
  /// rows"; check_data_files).
  std::vector<std::string> data;

  bool uses_workers() const { return !devices.empty(); }
  /// The assignment of `role` (every role of the job has one).
  const role_assignment* find(const std::string& role) const;
  /// The layout of `role` in `stage` (a role frozen there has one rank).
  parallel_layout layout_of(const std::string& stage, const std::string& role) const;
  /// How `role`'s DP ranks train (ddp for a role without an assignment).
  train::dp_strategy strategy_of(const std::string& role) const {
    auto* r = find(role);
    return r ? r->strategy : train::dp_strategy::ddp;
  }
  /// DP size of `role` in `stage`.
  int64_t dp_of(const std::string& stage, const std::string& role) const {
    return layout_of(stage, role).dp;
  }
  /// A worker label per device ("pool:role+role").
  std::vector<std::string> worker_labels() const;
  /// Devices on each node (its size is `nodes`).
  std::vector<int64_t> devices_per_node() const;
  /// The device of rank `rank` of `role`; -1 in process or when unknown.
  int64_t device_of(const std::string& role, int64_t rank) const;
  /// Human-readable: devices, their ranks and memory estimates.
  std::string render() const;
};

/// Placement rules (pools, roles, divisibility) found by job_config's check.
void check_placement(const job_config& c, runtime::config_checks& checks);

/// The plan of a checked job, or an error when a device's estimate exceeds
/// its memory (naming the device, its ranks, both numbers and the largest
/// term with the rank that holds it).
expected<placement_plan> make_plan(const job_config& cfg);

/// The placement keys of `role` (placement.roles' entry; the defaults —
/// dp 1, ddp, fp32 — when it has none).
role_placement_config placement_keys(const job_config& cfg, std::string_view role);

/// NOTE [strategy suggestions]: each trained role of placement.roles with
/// dp > 1 under
/// each strategy (the rest of the job as given), the plan made again:
/// whether every device still fits, the role's rank estimate there, and
/// the gradient and parameter bytes a rank receives a step (the ZeRO
/// paper's volumes: 2(N-1)/N·Φ for ddp, zero1 and zero2, 3(N-1)/N·Φ for
/// zero3, Φ the fp32 parameter bytes) — cheapest communication first, then
/// least memory. `troupe plan --suggest` prints it.
struct strategy_fit {
  std::string role;
  std::string yaml_path; // placement.roles[i].strategy
  train::dp_strategy strategy = train::dp_strategy::ddp;
  bool fits = false;
  double rank_bytes = 0;     // the role's rank 0 at its device's peak
  double received_bytes = 0; // a rank, a step
  std::string refusal;       // why not, when it does not fit
};
std::vector<strategy_fit> suggest_strategies(const job_config& cfg);

/// NOTE [layout suggestions]: the seed's calculator over a trained role's
/// G = dp · tp · pp ranks: every TP in {1, 2, 4, 8} and PP in {1, 2, 4, 8,
/// 16} with TP · PP dividing G and DP = G / (TP · PP), under the role's
/// strategy; a layout fits when the config checks and the plan accept it
/// (a TP group within a node, heads and layers divisible) and the role's
/// devices peak under 90 % of a device. Fitting ones first, then the least
/// communication (NOTE [communication volume]), then the smallest peak.
struct layout_fit {
  std::string role;
  std::string yaml_path; // placement.roles[i]
  parallel_layout layout;
  bool fits = false;
  double peak_bytes = 0; // the largest peak of the role's devices
  comm_volume comm;
  std::string refusal; // why not, when it does not fit
};
std::vector<layout_fit> suggest_layouts(const job_config& cfg);

/// The layouts as `troupe plan --suggest` prints them.
std::string render_layouts(const std::vector<layout_fit>& fits);

/// The suggestions as `troupe plan --suggest` prints them.
std::string render_suggestions(const std::vector<strategy_fit>& fits);

} // namespace troupe::actors::rl
