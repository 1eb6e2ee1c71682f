#pragma once
// What the trainer and the rollout share without either owning the other:
// the weight channel between them (plain data naming a transport of
// runtime/weight_transport.hpp), the cache of opened transports, weights by
// reference for the in-process alias, and the offload request both answer.

#include "runtime/weight_transport.hpp"

#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>
#include <caf/meta/type_name.hpp>

#include <map>
#include <memory>
#include <string>

namespace troupe::actors {

/// Co-located offload: free what an idle role need not hold (the rollout's
/// KV pool; a trainer's optimizer state and gradients, to disk).
using release_atom = caf::atom_constant<caf::atom("release")>;

/// Where versions of a trainer's weights travel to a rollout: the transport
/// (runtime/weight_transport.hpp) both sides open. Plain data, so it can be
/// sent to roles in other processes.
struct weight_channel {
  runtime::transport_kind kind = runtime::transport_kind::alias;
  /// Unique per job and pair of roles.
  std::string channel = "weights";
  /// disk: the folder of the versions.
  std::string dir;
  int64_t keep = 2;
  int64_t timeout_ms = 30000;
  /// broadcast: "host:port" of the TCPStore where the publisher (rank 0)
  /// and the receiver (rank 1) form their two-rank gloo group.
  std::string store;
  /// broadcast: the addresses the publisher's and the receiver's processes
  /// bind their gloo pairs to (their nodes' addresses).
  std::string publisher_host = "127.0.0.1";
  std::string receiver_host = "127.0.0.1";
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, weight_channel& x) {
  return f(caf::meta::type_name("weight_channel"), x.kind, x.channel, x.dir, x.keep, x.timeout_ms,
           x.store, x.publisher_host, x.receiver_host);
}

/// NOTE [sync staging]: what each end of a weight sync answers — the
/// version's bytes and the temporary bytes it held for them at most, beyond
/// its own state (a group: its largest rank's). The publisher: the copy its
/// transport stages, its export's gathers (a zero3 unit whole, the largest
/// tensor a TP gather or a later pipeline stage hands it); the receiver:
/// the version it holds while loading, where its transport stages one
/// (runtime::transport_traits::receiver_stages).
struct sync_bytes {
  int64_t bytes = 0;
  int64_t temporary = 0;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, sync_bytes& x) {
  return f(caf::meta::type_name("sync_bytes"), x.bytes, x.temporary);
}

/// The transport options of `c` (runtime/weight_transport.hpp).
runtime::transport_options transport_options_of(const weight_channel& c);

/// The transports an actor has opened, by kind and channel, with the
/// process groups of its broadcast channels (declared first: they outlive
/// the transports that use them).
struct transport_cache {
  std::map<std::string, std::shared_ptr<void>> groups;
  std::map<std::string, std::unique_ptr<runtime::weight_transport>> transports;
};

/// Which end of a channel an actor is (broadcast: its rank in the group).
enum class channel_side { publisher = 0, receiver = 1 };

/// The transport for `c` in `cache`, opened on first use (broadcast: joins
/// the channel's two-rank group, which blocks until the other side joins).
expected<runtime::weight_transport*> open_channel(transport_cache& cache, const weight_channel& c,
                                                  channel_side side);

/// Weights by HF name, shared read-only (the in-process alias transport:
/// the sender must not modify the tensors until the update is answered).
using shared_weights = std::shared_ptr<const std::map<std::string, at::Tensor>>;

} // namespace troupe::actors

// In-process only: weights by reference (the alias channel). Other
// processes get weights through the transports (receive_weights_atom).
// Caution: CAF skips such a type without a word when it serialises a
// message, so every other message type has an inspect and is registered in
// actors::configure.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::actors::shared_weights)
