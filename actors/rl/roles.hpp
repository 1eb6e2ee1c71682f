#pragma once
// The cast of a job as specs any process can build, and the role hosts that
// build them: in the driver's process, or in worker processes
// (cluster/role_host.hpp).
//
// NOTE [role hosting]: a role_spec names a role of a stage and carries the
// resolved job (the same YAML as <run>/config.yaml) plus the directory its
// model starts from, so the driver and a worker run the very same
// construction code (spawn_role) with the very same seeds: a job gives the
// same metrics whichever process hosts its roles. A role with dp > 1 is
// built once per data-parallel rank; the ranks join one c10d group through
// the TCPStore named in the spec, and the driver talks to them through one
// engine group actor (train/engine_group.hpp).

#include "runtime/error.hpp"

#include <caf/actor.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace troupe::models {
class tokenizer;
} // namespace troupe::models

namespace troupe::actors::rl {

/// NOTE [parallel layout]: a role's ranks form a mesh of dp data-parallel
/// replicas, each split tp ways by tensor parallelism and pp ways into
/// pipeline stages (rank = (d · pp + p) · tp + t, runtime::rank_mesh{{dp,
/// pp, tp}}); one process group per dimension. For the rollout, dp counts
/// independent engines and tp a tensor-parallel engine. The job file sets
/// it per role (placement.roles[].dp, .tp, .pp); the planner checks which
/// role takes which (the rollout tp only: NOTE [rollout group]).
struct parallel_layout {
  int32_t dp = 1;
  int32_t tp = 1;
  int32_t pp = 1;

  /// Ranks of the role (dp · tp · pp).
  int32_t ranks() const { return dp * tp * pp; }
  bool operator==(const parallel_layout&) const = default;
};

/// A rank's name in logs, plans and actor names: "policy" (one rank),
/// "policy[dp 1]", "policy[dp 0, tp 1]" (rank = d · tp + t).
std::string rank_name(const std::string& role, const parallel_layout& layout, int64_t rank);

/// A TP group's shared-memory slot a rank (NOTE [shm all-reduce] in
/// runtime/shm_collectives.hpp): 4 MiB holds the activations of a few
/// thousand tokens of a small model; larger sums go through gloo. Each rank
/// maps the group's segment; the planner counts its share.
inline constexpr int64_t tp_slot_bytes = int64_t{4} << 20;

/// A pipeline line's shared-memory mailboxes when its stages share a node
/// (NOTE [shm point-to-point] in runtime/shm_collectives.hpp): hand-offs up
/// to 1 MiB (a micro-batch's hidden states: 256 K floats) go through them,
/// larger ones through gloo; pp + 1 slots a neighbour pair, as 1F1B keeps
/// at most pp hand-offs in flight on one. The planner counts each rank's
/// share of the segment.
inline constexpr int64_t pp_slot_bytes = int64_t{1} << 20;
inline constexpr int pp_slots(int pp) {
  return pp + 1;
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, parallel_layout& x) {
  return f(caf::meta::type_name("parallel_layout"), x.dp, x.tp, x.pp);
}

struct role_spec {
  /// sft | rm | rl.
  std::string stage;
  /// policy | critic | reference | reward | rollout.
  std::string role;
  /// The resolved job (runtime::to_yaml of the job_config).
  std::string job_yaml;
  /// The HF directory the role's model starts from ("" for a rule-only reward).
  std::string model_dir;
  /// The role's mesh of ranks, and this instance's rank in it.
  parallel_layout layout;
  int32_t rank = 0;
  /// "host:port" of the TCPStore of the role's groups (more than one rank).
  std::string group_store;
  /// Key prefix of the groups in the store (unique per stage and role).
  std::string group_name;
  /// Bound on the group's rendezvous and collectives.
  int64_t timeout_ms = 60000;
  /// The address this rank's process binds its gloo pairs to (its node's).
  std::string host = "127.0.0.1";
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, role_spec& x) {
  return f(caf::meta::type_name("role_spec"), x.stage, x.role, x.job_yaml, x.model_dir, x.layout,
           x.rank, x.group_store, x.group_name, x.timeout_ms, x.host);
}

struct job_config;
struct weighted_backend;
class reward_backend;
class environment;
class agent_host;
class agent_book;
struct agent_endpoint_spec;

/// How roles get parts that are not the built-in ones (NOTE [reward
/// backends]): unset members mean the built-in parts.
struct role_factories {
  /// The reward role's backends in the rl stage (the job, the role's spec).
  std::function<expected<std::vector<weighted_backend>>(const job_config&, const role_spec&)> reward;
  /// rl.reward.kind remote: the RewardService client (cluster/remote_reward.hpp;
  /// troupe's processes set it), given the job and its tokenizer.
  std::function<expected<std::unique_ptr<reward_backend>>(const job_config&,
                                                          std::shared_ptr<const models::tokenizer>)>
      remote_reward;
  /// rl.environment.kind remote: the EnvironmentService client
  /// (cluster/remote_environment.hpp; troupe's processes set it).
  std::function<expected<std::unique_ptr<environment>>(const job_config&)> remote_environment;
  /// rl.agent: an iteration's OpenAI-compatible endpoint over the rollout
  /// (any handle to it) recording in the book, and the agent's process
  /// (cluster/agent_host.hpp; troupe's processes set it).
  std::function<expected<std::unique_ptr<agent_host>>(caf::actor_system&, caf::actor rollout,
                                                      std::shared_ptr<agent_book>,
                                                      const agent_endpoint_spec&)>
      agent_endpoint;
};

/// The job's environment by rl.environment.kind (NOTE [environments]): the
/// built-in ones scored by the job's rules, a remote one from `factories`;
/// null for kind none.
expected<std::shared_ptr<environment>> job_environment(const job_config& cfg,
                                                       const role_factories& factories);

/// Builds the role's actor in this process (a train engine actor, the
/// rollout actor or the reward actor, by the role and stage tables). Errors
/// name the role.
expected<caf::actor> spawn_role(caf::actor_system& sys, const role_spec& spec,
                                const role_factories& factories = {});

/// Builds every rank of `spec` (spec.layout.ranks() of them) with
/// `spawn_one`, concurrently (the ranks meet in the group's rendezvous):
/// opens the group's TCPStore at `store_host` first (the address the ranks'
/// processes reach this one at; kept in `stores` for the job's lifetime)
/// and fills in each rank's rank and group fields. One rank: just
/// spawn_one. On failure the ranks already built are stopped.
expected<std::vector<caf::actor>> spawn_ranks(
    const role_spec& spec, std::vector<std::shared_ptr<void>>& stores, const std::string& store_host,
    const std::function<expected<caf::actor>(const role_spec&)>& spawn_one);

/// Where role actors run.
class role_host {
public:
  virtual ~role_host() = default;
  /// Spawns the role, every rank of it (spec.layout.ranks()), and answers
  /// one actor per rank.
  virtual expected<std::vector<caf::actor>> spawn(caf::actor_system& sys, const role_spec& spec) = 0;
  /// The address the processes of the roles reach this (the driver's)
  /// process at: rendezvous stores listen there.
  virtual std::string store_host() const { return "127.0.0.1"; }
  /// The address of the process of rank `rank` of `role` (its node's).
  virtual std::string address_of(const std::string& role, int rank) const { return "127.0.0.1"; }

  /// The process of rank `rank` of `role`, for role events: a label
  /// ("driver" for this process) and its pid.
  struct place {
    std::string process;
    int64_t pid = 0;
    /// "" = the driver's machine.
    std::string node;
  };
  virtual place where(const std::string& role, int rank) const;
  /// The signal that ended the process of `role`'s rank `rank` (waiting up
  /// to `timeout_ms` for it to be reaped); 0 when it runs or is this one.
  virtual int exit_signal(const std::string& role, int rank, int64_t timeout_ms) { return 0; }
  /// Before `spec`'s role is built again after it was lost (NOTE
  /// [supervision]): makes the processes of its ranks able to host it
  /// again — a worker that ended is started anew (one that still runs but
  /// lost its connection is killed first: fencing). Nothing to do here.
  virtual expected<void> revive(const role_spec& spec) { return {}; }
  /// What the host knows of how rank `rank` of `role` was lost ("" when
  /// nothing): a worker found hung by its heartbeats.
  virtual std::string loss_detail(const std::string& role, int rank) const { return ""; }
  /// Whether a process hosting a rank of `role` was started again since
  /// the role was built there (another role's restart revived it): the
  /// role went with the old process. Never here.
  virtual bool stale(const std::string& role) const { return false; }
};

/// Every role in the calling process, built with `factories`; each rank
/// behind a role proxy (NOTE [role proxy]), so a rank that ends while it
/// holds a request fails it as lost.
class in_process_host final : public role_host {
public:
  explicit in_process_host(role_factories factories = {}) : factories_(std::move(factories)) {}
  expected<std::vector<caf::actor>> spawn(caf::actor_system& sys, const role_spec& spec) override;

private:
  role_factories factories_;
  std::vector<std::shared_ptr<void>> stores_;
};

} // namespace troupe::actors::rl
