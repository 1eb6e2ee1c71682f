#pragma once
// The controller's table of node agents (docs/cluster.md).
//
// NOTE [node membership]: an agent (`troupe node`) holds one stream to the
// controller for its life (NodeService.Attach). Its first message names it
// and its resources; it is then `ready` and heartbeats every heartbeat_ms.
//
//   (join) ──► ready ──stream broke / silent for lost_after_ms──► lost
//                 │
//                 └──NodeLeave (agent stopped)──► left
//
// A lost or left node may join again under its name (a new session); a
// name held by a ready node is refused, so two agents never share one.
// Silence is found by sweep(), which the node service calls a few times a
// second: a node is lost at most lost_after_ms + one sweep period after its
// last heartbeat. Whoever asked (on_lost) hears of every lost node once:
// the controller fails the jobs with processes on it.
//
// The table is in memory: agents join again after a controller restart.

#include "cluster/job_nodes.hpp"
#include "runtime/enum_names.hpp"
#include "runtime/error.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::cluster {

enum class node_state : uint8_t { ready, lost, left };
TROUPE_ENUM_NAMES(node_state, "ready", "lost", "left")

struct node_resources {
  int32_t cores = 0;
  int64_t memory_bytes = 0;
  int32_t gpus = 0;
};

/// What an agent says of itself when it joins.
struct node_hello {
  std::string name;
  /// "" = the host of `peer`.
  std::string advertise_host;
  node_resources resources;
  std::string version;
  int64_t pid = 0;
};

struct node_view {
  std::string name;
  node_state state = node_state::ready;
  /// Where the node is reached: its advertised host, or its connection's.
  std::string address;
  /// The connection as the controller sees it ("ipv4:10.0.0.2:41234").
  std::string peer;
  node_resources resources;
  int64_t joined_time_us = 0;
  int64_t last_heartbeat_us = 0;
  /// When it entered its state (joined, was lost, left).
  int64_t state_time_us = 0;
  /// Why it was lost or left.
  std::string reason;
  std::string version;
  int64_t agent_pid = 0;
};

struct node_options {
  /// How often agents heartbeat.
  int64_t heartbeat_ms = 1000;
  /// Silence after which a node is lost.
  int64_t lost_after_ms = 3000;
};

/// "ipv4:10.0.0.2:41234" / "ipv6:[::1]:5000" → "10.0.0.2" / "::1"; "" when
/// it is neither.
std::string host_of_peer(const std::string& peer);

/// Whether `name` may name a node: [A-Za-z0-9._-]{1,63}.
bool valid_node_name(std::string_view name);

class node_registry {
public:
  explicit node_registry(node_options o = {});

  const node_options& options() const { return opt_; }

  /// Ends a session from the registry's side (it was found silent); called
  /// at most once, without the registry's lock held.
  using closer = std::function<void(const std::string& reason)>;

  /// Delivers a command to the session's agent; false when its stream ended.
  using sender = std::function<bool(const node_command&)>;

  /// A new session for `hello` seen at `peer`: its id, or invalid_argument
  /// (a bad name, no usable address) / illegal_state (a ready node has the
  /// name).
  expected<uint64_t> join(const node_hello& hello, const std::string& peer, closer close, int64_t now_us,
                          sender send = {});
  void heartbeat(uint64_t session, int64_t now_us);
  /// The agent said it leaves: `left`.
  void leave(uint64_t session, const std::string& reason, int64_t now_us);
  /// The session's stream ended; a node that did not leave is `lost`.
  void disconnected(uint64_t session, const std::string& reason, int64_t now_us);
  /// Marks nodes silent for lost_after_ms lost and ends their sessions;
  /// answers their names.
  std::vector<std::string> sweep(int64_t now_us);

  std::vector<node_view> list() const;
  std::optional<node_view> find(const std::string& name) const;

  /// Called (without the lock) for each node that becomes lost.
  void on_lost(std::function<void(const node_view&)> f);
  /// Called (without the lock) for each node that joins (is ready).
  void on_joined(std::function<void(const node_view&)> f);

  /// Sends `c` to the agent of node `name` (without the lock held); false
  /// when the node is not ready or its stream has ended.
  bool send(const std::string& name, const node_command& c);
  /// A WorkerExited from a session's agent: the listeners hear it with the
  /// node's name (a session that is no longer ready is ignored).
  void worker_exited(uint64_t session, const worker_exit& x);
  void on_worker_exit(std::function<void(const std::string& node, const worker_exit&)> f);

private:
  struct entry {
    node_view view;
    uint64_t session = 0;
    closer close;
    sender send;
  };
  entry* by_session(uint64_t session);
  // Marks `e` lost; answers what must be called once the lock is dropped
  // (its closer, if it still has one, and the listeners).
  std::function<void()> lose(entry& e, const std::string& reason, int64_t now_us);

  node_options opt_;
  mutable std::mutex mu_;
  std::map<std::string, entry> nodes_;
  uint64_t next_session_ = 1;
  std::vector<std::function<void(const node_view&)>> lost_listeners_;
  std::vector<std::function<void(const node_view&)>> joined_listeners_;
  std::vector<std::function<void(const std::string&, const worker_exit&)>> exit_listeners_;
};

} // namespace troupe::cluster
