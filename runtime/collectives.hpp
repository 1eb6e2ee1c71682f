#pragma once
// c10d process groups behind a light header: a TCPStore rendezvous and
// ProcessGroupGloo on CPU (ProcessGroupNCCL joins when LibTorch has CUDA).
// Blocking calls: use them from detached actors or worker threads only.

#include "runtime/enum_names.hpp"
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

/// How a collective combines the ranks' values. mean is the sum divided by
/// the group size (floating-point tensors only).
enum class reduce_op : uint8_t { sum = 0, mean = 1, max = 2, min = 3 };
TROUPE_ENUM_NAMES(reduce_op, "sum", "mean", "max", "min")

/// A started point-to-point transfer; wait() blocks until it is done, failed
/// or past the group's timeout.
class pending_transfer {
public:
  virtual ~pending_transfer() = default;
  virtual expected<void> wait() = 0;
};

/// One rank's end of a group: the primitives a process_group is built on.
/// The real one wraps c10d's ProcessGroupGloo; tests wrap it again to
/// inject faults (tests/support/faulty_group.hpp). Tensors are contiguous
/// and checked by process_group before they get here; every call blocks
/// until done, failed, or past the group's timeout. Not thread-safe: one
/// caller at a time.
class collective_backend {
public:
  virtual ~collective_backend() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// NOTE [calls in flight] (runtime/inflight.hpp): equal on every rank of
  /// the group, distinct between groups; 0 = not watched.
  virtual uint64_t identity() const { return 0; }
  /// In place over ranks; `op` is never mean (process_group divides).
  virtual expected<void> all_reduce(at::Tensor& tensor, reduce_op op) = 0;
  virtual expected<void> broadcast(at::Tensor& tensor, int root) = 0;
  /// The result lands in root's tensor; `op` is never mean.
  virtual expected<void> reduce(at::Tensor& tensor, int root, reduce_op op) = 0;
  /// `outputs` holds size() tensors at the root, none elsewhere.
  virtual expected<void> gather(at::Tensor& input, std::vector<at::Tensor>& outputs, int root) = 0;
  /// `inputs` holds size() tensors at the root, none elsewhere.
  virtual expected<void> scatter(std::vector<at::Tensor>& inputs, at::Tensor& output, int root) = 0;
  /// 1-D tensors of equal length, a multiple of size().
  virtual expected<void> all_to_all(at::Tensor& input, at::Tensor& output) = 0;
  virtual expected<void> barrier() = 0;
  /// Flat collectives the backend runs natively; errc::unsupported (the
  /// default) makes process_group run them as rings over send / recv.
  virtual expected<void> all_gather(at::Tensor& input, at::Tensor& output);
  virtual expected<void> reduce_scatter(at::Tensor& input, at::Tensor& output, reduce_op op);
  /// Point to point; `tag` pairs a send with its receive.
  virtual expected<std::unique_ptr<pending_transfer>> start_send(at::Tensor& tensor, int dst,
                                                                 int tag) = 0;
  virtual expected<std::unique_ptr<pending_transfer>> start_recv(at::Tensor& tensor, int src,
                                                                 int tag) = 0;
  /// A group of the members `ranks` (sorted, this rank among them) under
  /// `name`; every member calls it, non-members do not.
  virtual expected<std::unique_ptr<collective_backend>> subgroup(const std::string& name,
                                                                 const std::vector<int>& ranks) = 0;
};

/// Bytes one rank moved point to point: its sends and receives, and the
/// collectives process_group builds on them (ring all-gather and
/// reduce-scatter). Collectives the backend runs natively are not counted.
struct p2p_traffic {
  int64_t bytes_sent = 0;
  int64_t bytes_received = 0;
};

/// One process group: this rank's view of a c10d group (or any
/// collective_backend). Every call blocks until it completes or the group's
/// timeout expires, and fails with errc::timeout when a peer did not come,
/// errc::unavailable when a peer's connection closed, errc::invalid_argument
/// or errc::shape_mismatch for a call that breaks its contract (checked on
/// this rank before anything is sent). Not thread-safe: one caller at a time.
class process_group {
public:
  process_group();
  /// A group over `backend` (the fault-injecting groups of the tests).
  explicit process_group(std::unique_ptr<collective_backend> backend);
  ~process_group();
  process_group(process_group&&) noexcept;
  process_group& operator=(process_group&&) noexcept;

  int rank() const;
  int size() const;
  /// The backend's identity (NOTE [calls in flight]): while a blocking
  /// call runs, it is listed in runtime::calls_in_flight().
  uint64_t identity() const;
  /// In-place sum over ranks.
  expected<void> all_reduce_sum(at::Tensor& tensor);
  /// In place: every rank ends with `op` over the ranks' tensors.
  expected<void> all_reduce(at::Tensor& tensor, reduce_op op);
  /// In-place broadcast from `root`.
  expected<void> broadcast(at::Tensor& tensor, int root);
  expected<void> barrier();
  /// `op` over the ranks' tensors into root's tensor (the others' tensors
  /// are left unspecified).
  expected<void> reduce(at::Tensor& tensor, int root, reduce_op op);
  /// Flat all-gather: `output` (size()·n elements, any shape) receives the
  /// ranks' `input`s (n elements each) in rank order.
  expected<void> all_gather(const at::Tensor& input, at::Tensor& output);
  /// Flat reduce-scatter: `input` holds size()·n elements; rank r's
  /// `output` (n elements) receives `op` over the ranks' r-th n-element
  /// chunks. As a ring each rank sends (size()−1)/size() of `input`.
  expected<void> reduce_scatter(const at::Tensor& input, at::Tensor& output, reduce_op op);
  /// The root sends inputs[r] (each shaped like `output`) to rank r's
  /// `output`; other ranks pass no inputs.
  expected<void> scatter(const std::vector<at::Tensor>& inputs, at::Tensor& output, int root);
  /// The root receives rank r's `input` in outputs[r] (size() tensors shaped
  /// like `input`); other ranks pass no outputs.
  expected<void> gather(const at::Tensor& input, std::vector<at::Tensor>& outputs, int root);
  /// `input` and `output` hold size()·n elements: rank r's output chunk j
  /// (n elements) receives rank j's input chunk r.
  expected<void> all_to_all(const at::Tensor& input, at::Tensor& output);
  /// Sends `tensor` to rank `dst`, which receives it with recv(src, same
  /// tag). Tags are in [0, max_user_tag].
  expected<void> send(const at::Tensor& tensor, int dst, int tag);
  /// Receives into `tensor` (its size must match the send) from `src`.
  expected<void> recv(at::Tensor& tensor, int src, int tag);
  /// send() started and not waited for: the caller keeps `tensor` alive and
  /// unchanged until the transfer's wait() returns (a pipeline stage sends
  /// its output on and goes on computing, so that neighbours sending to
  /// each other at once do not wait on each other).
  expected<std::unique_ptr<pending_transfer>> start_send(const at::Tensor& tensor, int dst,
                                                         int tag);
  /// recv() started and not waited for: `tensor` holds the data once the
  /// transfer's wait() returns (a pipeline stage posts the receive of its
  /// next input before computing, so that the transfer overlaps it).
  expected<std::unique_ptr<pending_transfer>> start_recv(at::Tensor& tensor, int src, int tag);
  /// A sub-group of this group's ranks `ranks` (ascending, distinct, this
  /// rank among them), named `name` (unique per group: the name keys its
  /// rendezvous). Every member calls it; it blocks until all have.
  expected<process_group> split(const std::string& name, const std::vector<int>& ranks);
  /// Bytes moved point to point since the group was made.
  p2p_traffic traffic() const;
  /// Hands the backend over, leaving this group empty (to wrap it in
  /// another backend, as the tests' fault injection does).
  std::unique_ptr<collective_backend> release_backend() &&;

  static constexpr int max_user_tag = (1 << 24) - 1;

  struct impl;
  std::unique_ptr<impl> impl_;
};

/// Ranks laid out on a row-major grid: shape {a, b} puts rank r at
/// (r / b, r % b). A role's layout {dp, tp, pp} is such a mesh.
struct rank_mesh {
  std::vector<int> shape;

  /// The number of ranks (the product of the shape).
  int size() const;
  /// The coordinates of `rank`.
  std::vector<int> coords(int rank) const;
  /// The ranks that share every coordinate of `rank` but dimension `dim`,
  /// ascending (the members of rank's group along `dim`).
  std::vector<int> line(int rank, size_t dim) const;
  /// Which of the lines along `dim` holds `rank`: its other coordinates in
  /// mesh order, 0 .. size() / shape[dim] - 1 (names a line's shared
  /// segment: every rank of the line gets the same index).
  int line_index(int rank, size_t dim) const;
};

/// This rank's group along each dimension of `mesh` (result[d] joins
/// mesh.line(world.rank(), d), named "<names[d]>"); `world` must have
/// mesh.size() ranks, and every rank of it calls this with the same mesh.
expected<std::vector<process_group>> make_mesh_groups(process_group& world, const rank_mesh& mesh,
                                                      const std::vector<std::string>& names);

/// Broadcasts `bytes` from `root` to every rank of `group` (its length,
/// then its bytes); the others' `bytes` are replaced.
expected<void> broadcast_bytes(process_group& group, std::string& bytes, int root);

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
