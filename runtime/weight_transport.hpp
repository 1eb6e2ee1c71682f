#pragma once
// Weight transports: how a trainer's weights reach an inference engine.
//
// One interface, `publish(version, tensors)` on the sending side and
// `receive(version)` on the receiving side, over the channel that fits the
// placement of the two roles:
//
//   alias      same process: the receiver gets the publisher's tensors
//              (zero copy).
//   shm        same host: POSIX shared memory the receiver maps read-only
//              (the CPU analogue of CUDA IPC handles).
//   broadcast  any placement with a c10d group between the two sides: the
//              root broadcasts a table and then the bytes, in buckets.
//   disk       a shared folder: safetensors + a manifest, renamed into place.
//
// NOTE [versioned transfers]: versions increase strictly on the publishing
// side. Every transfer carries a table (name, dtype, shape, byte range and
// hash64 of each tensor; see runtime/hash.hpp), and `receive(v)` returns the
// weights of exactly version v or an error: version_mismatch when what is
// there is older (stale) or newer (overwritten) than v, not_found when
// nothing was published, corrupted when a size, bound or hash does not match
// or a writer did not finish. A receiver never sees part of a version.
//
// Blocking calls (file I/O, collectives, lock waits): use them from detached
// actors or worker threads.

#include "runtime/enum_names.hpp"
#include "runtime/error.hpp"
#include "runtime/safetensors.hpp"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace troupe::runtime {

class process_group;

/// The kinds of transport, in one list (NOTE [enum names]).
enum class transport_kind : uint8_t { alias, shm, broadcast, disk, cuda_ipc };
TROUPE_ENUM_NAMES(transport_kind, "alias", "shm", "broadcast", "disk", "cuda_ipc")

/// NOTE [transport traits]: what a kind asks of the placement of its two
/// ends and of the code that drives them. The planner refuses a forced
/// kind whose reach the placement exceeds; the driver starts publish and
/// receive together for a kind whose ends meet in a collective.
struct transport_traits {
  /// How far apart the two ends may be.
  enum class reach : uint8_t { process, host, any };
  reach span = reach::any;
  /// Both ends take part at once (a collective): the publisher's publish
  /// and the receiver's receive must be in flight together.
  bool both_ends_at_once = false;
  /// Needs a c10d group between the two sides (a rendezvous store).
  bool needs_group = false;
  /// Needs a folder both ends see.
  bool needs_dir = false;
  /// Needs CUDA tensors and a build with CUDA.
  bool needs_cuda = false;
  /// A version reaches one receiver (a two-rank collective); the other
  /// kinds serve any number of receivers reading the same version (a
  /// tensor-parallel rollout's ranks: NOTE [rollout group]).
  bool one_receiver = false;
  /// NOTE [sync staging]: the receiver holds a version's bytes of its own
  /// while it loads them (the mapped shm slot, the file read, the buffer
  /// received); alias and CUDA IPC hand it the publisher's memory. The
  /// publisher of every kind stages one whole copy (the clone a publish
  /// takes, the broadcast's send buffer).
  bool receiver_stages = true;
};

/// The traits of `kind`.
transport_traits traits_of(transport_kind kind) noexcept;

/// Whether this build can make transports of `kind` (cuda_ipc: built with CUDA).
bool available(transport_kind kind) noexcept;

struct transport_options {
  /// cuda_ipc: CUDA tensors; builds with CUDA.
  transport_kind kind = transport_kind::alias;
  /// Names the pair of roles; both sides use the same name. Letters, digits
  /// and . _ - only (it becomes a file or shared-memory name).
  std::string channel = "weights";
  /// disk: the folder holding <channel>/v<version>/ (shared by both sides).
  std::string dir;
  /// broadcast: the group both sides belong to, and the publishing rank.
  process_group* group = nullptr;
  int root = 0;
  /// broadcast: the payload travels in flat buffers of at most this size.
  int64_t bucket_bytes = int64_t{25} << 20;
  /// shm / disk: published versions kept (older ones are removed); >= 1.
  int keep = 2;
  /// shm: how long publish waits for receivers still reading the slot it
  /// reuses, and receive for a publisher still writing.
  int64_t timeout_ms = 30000;
};

/// What receive() hands over.
///
/// `tensors` stay valid as long as this object (or a copy of a tensor) lives.
/// shm: they are read-only views of the shared segment, and while any of
/// them lives the publisher cannot reuse that slot (it waits, then fails with
/// a timeout naming the channel); copy them into the model and drop them.
struct received_weights {
  int64_t version = -1;
  tensor_map tensors;
  /// Total bytes of tensor data.
  uint64_t bytes = 0;
};

/// NOTE [streamed publish]: a tensor of a publish named before its values
/// exist, so that a transport can send what is ready while the publisher
/// makes the rest (a zero3 trainer gathers its weights a unit at a time).
struct tensor_spec {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;

  /// Bytes of its values.
  int64_t bytes() const {
    int64_t n = static_cast<int64_t>(c10::elementSize(dtype));
    for (auto d : shape)
      n *= d;
    return n;
  }
};
/// Hands the values over: put(i, t) for each i of the layout, in order.
using tensor_sink = std::function<void(size_t, const at::Tensor&)>;
using tensor_producer = std::function<expected<void>(const tensor_sink& put)>;

class weight_transport {
public:
  virtual ~weight_transport() = default;
  virtual transport_kind kind() const = 0;
  /// Makes `tensors` (CPU or not, any layout, dtypes safetensors knows)
  /// available as `version`; fails with version_mismatch when `version` is
  /// not above the last one published through this object.
  virtual expected<void> publish(int64_t version, const tensor_map& tensors) = 0;
  /// The same, the tensors of `layout` made by `produce` as it goes (NOTE
  /// [streamed publish]): the broadcast sends each bucket as soon as it is
  /// filled, overlapping the producer; the others take the whole first.
  virtual expected<void> publish_streamed(int64_t version, const std::vector<tensor_spec>& layout,
                                          const tensor_producer& produce);
  /// The weights of exactly `version` (see NOTE [versioned transfers]).
  virtual expected<received_weights> receive(int64_t version) = 0;
};

/// A transport endpoint; the publishing and the receiving side each make one
/// with the same options (broadcast: every rank of the group).
expected<std::unique_ptr<weight_transport>> make_weight_transport(const transport_options& options);

/// Removes the shared-memory segments of channels named
/// `<channel_prefix><pid>...` whose process `pid` no longer exists (left by
/// a job that was killed); answers how many.
int remove_orphaned_shm_segments(const std::string& channel_prefix);

} // namespace troupe::runtime
