#pragma once
// c10d process groups behind a light header: a TCPStore rendezvous and
// ProcessGroupGloo on CPU (ProcessGroupNCCL joins when LibTorch has CUDA).
// Blocking calls: use them from detached actors or worker threads only.

#include "runtime/error.hpp"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace troupe::runtime {

/// Where and how to meet: the server side binds `port` (0 = ephemeral, read
/// it back with port()), clients connect to host:port.
struct store_options {
  std::string host = "127.0.0.1";
  uint16_t port = 0;
  bool is_server = false;
  int64_t timeout_ms = 30000;
};

/// A key-value rendezvous store shared by the ranks of a job.
class store {
public:
  store();
  ~store();
  store(store&&) noexcept;
  store& operator=(store&&) noexcept;

  /// The port the store listens on (server) or connects to (client).
  uint16_t port() const;
  /// Sets a key (visible to every rank).
  expected<void> set(const std::string& key, const std::string& value);
  /// Waits for a key (bounded by the store timeout) and returns its value.
  expected<std::string> get(const std::string& key);

  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Connects to (or starts) a TCPStore.
expected<store> make_tcp_store(const store_options& options);

/// Connects to the TCPStore at "host:port"; a malformed address is an
/// invalid_argument error quoting it.
expected<store> connect_tcp_store(const std::string& address, int64_t timeout_ms);

struct group_options {
  /// "gloo" (CPU tensors) or "nccl" (CUDA tensors; needs a CUDA LibTorch).
  std::string backend = "gloo";
  int rank = 0;
  int world_size = 1;
  /// Key prefix separating several groups on one store ("policy/dp").
  std::string name = "default";
  /// Address gloo binds for its pairs.
  std::string interface_host = "127.0.0.1";
  int64_t timeout_ms = 30000;
};

/// One c10d process group. Every collective blocks until it completes or the
/// group timeout expires.
class process_group {
public:
  process_group();
  ~process_group();
  process_group(process_group&&) noexcept;
  process_group& operator=(process_group&&) noexcept;

  int rank() const;
  int size() const;
  /// In-place sum over ranks.
  expected<void> all_reduce_sum(at::Tensor& tensor);
  /// In-place broadcast from `root`.
  expected<void> broadcast(at::Tensor& tensor, int root);
  expected<void> barrier();

  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Creates a process group over `rendezvous`; every rank must call this with
/// the same name, backend and world size.
expected<process_group> make_process_group(store& rendezvous, const group_options& options);

/// `world` ranks of one group inside this process (one store server plus a
/// client per other rank), for tests, benchmarks and in-process data
/// parallelism: rank r is groups[r]; use each from its own thread.
struct local_groups {
  std::vector<store> stores;
  std::vector<process_group> groups;
};

/// Creates them concurrently; `options.rank` and `world_size` are ignored.
expected<local_groups> make_local_groups(int world, const group_options& options);

/// c10d backends this build can create ("gloo", and "nccl" with CUDA LibTorch).
std::vector<std::string> available_backends();

} // namespace troupe::runtime
