// process_group over any collective_backend: contract checks, mean as a
// divided sum, ring all-gather and reduce-scatter on send / recv where the
// backend lacks them, sub-groups and meshes, and the point-to-point byte
// counters (NOTE [ring collectives]).
#include "runtime/collectives.hpp"

#include "runtime/inflight.hpp"
#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <utility>

namespace troupe::runtime {

// NOTE [ring collectives]: gloo in LibTorch 1.13 has neither reduce-scatter
// nor a flat all-gather, so process_group runs them as rings on the
// backend's send / recv. Rank r sends to r+1 and receives from r−1; in step
// s (0 ≤ s < N−1) reduce-scatter sends its partial chunk (r−s−1) mod N and
// adds the received chunk (r−s−2) mod N into its own copy, so after N−1
// steps chunk r holds every rank's contribution; all-gather sends the chunk
// it got last ((r−s) mod N, its own first) and stores (r−s−1) mod N. Each
// rank sends N−1 chunks of n elements: (N−1)/N of the buffer, the
// bandwidth-optimal volume, which p2p_traffic lets the tests count. The
// send and the receive of a step are in flight together, so no rank waits
// for a send before posting its receive. Ring traffic uses tags above
// max_user_tag, so it never pairs with a caller's own send / recv.

expected<void> collective_backend::all_gather(at::Tensor&, at::Tensor&) {
  return make_error(errc::unsupported, "no native all_gather");
}

expected<void> collective_backend::reduce_scatter(at::Tensor&, at::Tensor&, reduce_op) {
  return make_error(errc::unsupported, "no native reduce_scatter");
}

struct process_group::impl {
  std::unique_ptr<collective_backend> backend;
  p2p_traffic traffic;
  std::set<std::string> subgroup_names;

  /// NOTE [calls in flight]: lists the call while it runs.
  scoped_call watch(collective_op op) const {
    return scoped_call{backend->identity(), backend->rank(), backend->size(), op};
  }
};

namespace {

constexpr int ring_tag = process_group::max_user_tag + 1;

// NOTE [calls in flight]: transfers move in pieces of at most this many
// bytes, each a backend call of its own whose end is progress.
constexpr int64_t piece_bytes = int64_t{64} << 20;

// `piece(nullopt)` when `like` (contiguous) fits in piece_bytes, else
// `piece({offset, length})` over its flat elements in turn, noting the
// progress of each.
template <class Piece>
expected<void> by_pieces(const at::Tensor& like, Piece&& piece) {
  const int64_t n = like.numel();
  const int64_t step = std::max<int64_t>(1, piece_bytes / std::max<int64_t>(1, like.element_size()));
  if (n <= step)
    return piece(std::optional<std::pair<int64_t, int64_t>>{});
  for (int64_t at = 0; at < n; at += step) {
    if (auto ok = piece(std::optional{std::pair{at, std::min(step, n - at)}}); !ok)
      return ok;
    note_progress();
  }
  return {};
}

// `call` over `tensor`, or over each piece of its flat view (by_pieces).
template <class Call>
expected<void> in_pieces(at::Tensor& tensor, Call&& call) {
  return by_pieces(tensor, [&](std::optional<std::pair<int64_t, int64_t>> p) -> expected<void> {
    if (!p)
      return call(tensor);
    auto part = tensor.view({-1}).narrow(0, p->first, p->second);
    return call(part);
  });
}

std::string in(const char* op, const process_group::impl& g) {
  return std::string{op} + " (rank " + std::to_string(g.backend->rank()) + " of " +
         std::to_string(g.backend->size()) + ")";
}

caf::error bad(errc code, const char* op, const process_group::impl& g, const std::string& why) {
  return make_error(code, in(op, g) + ": " + why);
}

expected<void> check_tensor(const char* op, const process_group::impl& g, const at::Tensor& t,
                            const char* name) {
  if (!t.defined())
    return bad(errc::invalid_argument, op, g, std::string{name} + " is undefined");
  if (!t.is_contiguous())
    return bad(errc::invalid_argument, op, g, std::string{name} + " is not contiguous");
  return {};
}

expected<void> check_root(const char* op, const process_group::impl& g, int root) {
  if (root < 0 || root >= g.backend->size())
    return bad(errc::invalid_argument, op, g,
               "root " + std::to_string(root) + " outside [0, " +
                   std::to_string(g.backend->size()) + ")");
  return {};
}

expected<void> check_mean(const char* op, const process_group::impl& g, const at::Tensor& t,
                          reduce_op how) {
  if (how == reduce_op::mean && !at::isFloatingType(t.scalar_type()))
    return bad(errc::invalid_argument, op, g, "mean needs a floating-point tensor");
  return {};
}

expected<void> check_same(const char* op, const process_group::impl& g, const at::Tensor& t,
                          const at::Tensor& like, const std::string& name) {
  if (auto ok = check_tensor(op, g, t, name.c_str()); !ok)
    return ok;
  if (t.sizes() != like.sizes() || t.scalar_type() != like.scalar_type())
    return bad(errc::shape_mismatch, op, g,
               name + " is not shaped and typed like the local tensor");
  return {};
}

/// `numel` must be `factor` times `of`'s.
expected<void> check_multiple(const char* op, const process_group::impl& g, const at::Tensor& big,
                              const at::Tensor& small, int64_t factor) {
  if (big.numel() != small.numel() * factor || big.scalar_type() != small.scalar_type())
    return bad(errc::shape_mismatch, op, g,
               "expected " + std::to_string(factor) + " x " + std::to_string(small.numel()) +
                   " elements of one dtype, got " + std::to_string(big.numel()));
  return {};
}

reduce_op native_op(reduce_op how) {
  return how == reduce_op::mean ? reduce_op::sum : how;
}

} // namespace

process_group::process_group() = default;
process_group::process_group(std::unique_ptr<collective_backend> backend)
    : impl_(std::make_unique<impl>()) {
  impl_->backend = std::move(backend);
}
process_group::~process_group() = default;
process_group::process_group(process_group&&) noexcept = default;
process_group& process_group::operator=(process_group&&) noexcept = default;

int process_group::rank() const {
  return impl_ ? impl_->backend->rank() : 0;
}

int process_group::size() const {
  return impl_ ? impl_->backend->size() : 0;
}

uint64_t process_group::identity() const {
  return impl_ ? impl_->backend->identity() : 0;
}

std::unique_ptr<collective_backend> process_group::release_backend() && {
  if (!impl_)
    return nullptr;
  auto out = std::move(impl_->backend);
  impl_.reset();
  return out;
}

p2p_traffic process_group::traffic() const {
  return impl_ ? impl_->traffic : p2p_traffic{};
}

namespace {

[[gnu::noinline]] caf::error empty_group(const char* op) {
  std::string what{op};
  what += " on an empty process group";
  return make_error(errc::invalid_argument, std::move(what));
}

} // namespace

#define TROUPE_GROUP_CHECK(op)                                                                     \
  if (!impl_)                                                                                      \
    return empty_group(op);

#define TROUPE_TRY(expr)                                                                           \
  if (auto ok_ = (expr); !ok_)                                                                     \
    return ok_.error();

namespace {
expected<void> ring_all_reduce(process_group::impl& g, at::Tensor& tensor, reduce_op how);
} // namespace

expected<void> process_group::all_reduce_sum(at::Tensor& tensor) {
  return all_reduce(tensor, reduce_op::sum);
}

expected<void> process_group::all_reduce(at::Tensor& tensor, reduce_op how) {
  TROUPE_GROUP_CHECK("all_reduce");
  const auto watch = impl_->watch(collective_op::all_reduce);
  TROUPE_TRY(check_tensor("all_reduce", *impl_, tensor, "tensor"));
  TROUPE_TRY(check_mean("all_reduce", *impl_, tensor, how));
  auto native = in_pieces(
      tensor, [&](at::Tensor& piece) { return impl_->backend->all_reduce(piece, native_op(how)); });
  if (!native && code_of(native.error()) == errc::unsupported)
    native = ring_all_reduce(*impl_, tensor, how);
  TROUPE_TRY(native);
  if (how == reduce_op::mean)
    return guarded("all_reduce mean", [&] { tensor.div_(size()); });
  return {};
}

expected<void> process_group::broadcast(at::Tensor& tensor, int root) {
  TROUPE_GROUP_CHECK("broadcast");
  const auto watch = impl_->watch(collective_op::broadcast);
  TROUPE_TRY(check_tensor("broadcast", *impl_, tensor, "tensor"));
  TROUPE_TRY(check_root("broadcast", *impl_, root));
  return in_pieces(tensor,
                   [&](at::Tensor& piece) { return impl_->backend->broadcast(piece, root); });
}

expected<void> process_group::barrier() {
  TROUPE_GROUP_CHECK("barrier");
  const auto watch = impl_->watch(collective_op::barrier);
  return impl_->backend->barrier();
}

expected<void> process_group::reduce(at::Tensor& tensor, int root, reduce_op how) {
  TROUPE_GROUP_CHECK("reduce");
  const auto watch = impl_->watch(collective_op::reduce);
  TROUPE_TRY(check_tensor("reduce", *impl_, tensor, "tensor"));
  TROUPE_TRY(check_root("reduce", *impl_, root));
  TROUPE_TRY(check_mean("reduce", *impl_, tensor, how));
  auto native = impl_->backend->reduce(tensor, root, native_op(how));
  if (!native && code_of(native.error()) == errc::unsupported) // reduced in fp32
    native = guarded("reduce in fp32", [&]() -> expected<void> {
      auto wide = tensor.to(at::kFloat);
      TROUPE_TRY(impl_->backend->reduce(wide, root, native_op(how)));
      tensor.copy_(wide);
      return {};
    });
  TROUPE_TRY(native);
  if (how == reduce_op::mean && rank() == root)
    return guarded("reduce mean", [&] { tensor.div_(size()); });
  return {};
}

expected<void> process_group::scatter(const std::vector<at::Tensor>& inputs, at::Tensor& output,
                                      int root) {
  TROUPE_GROUP_CHECK("scatter");
  const auto watch = impl_->watch(collective_op::scatter);
  TROUPE_TRY(check_tensor("scatter", *impl_, output, "output"));
  TROUPE_TRY(check_root("scatter", *impl_, root));
  auto expected_inputs = rank() == root ? static_cast<size_t>(size()) : 0;
  if (inputs.size() != expected_inputs)
    return bad(errc::invalid_argument, "scatter", *impl_,
               "expected " + std::to_string(expected_inputs) + " inputs, got " +
                   std::to_string(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i)
    TROUPE_TRY(
        check_same("scatter", *impl_, inputs[i], output, "inputs[" + std::to_string(i) + "]"));
  auto copy = inputs;
  return impl_->backend->scatter(copy, output, root);
}

expected<void> process_group::gather(const at::Tensor& input, std::vector<at::Tensor>& outputs,
                                     int root) {
  TROUPE_GROUP_CHECK("gather");
  const auto watch = impl_->watch(collective_op::gather);
  TROUPE_TRY(check_tensor("gather", *impl_, input, "input"));
  TROUPE_TRY(check_root("gather", *impl_, root));
  auto expected_outputs = rank() == root ? static_cast<size_t>(size()) : 0;
  if (outputs.size() != expected_outputs)
    return bad(errc::invalid_argument, "gather", *impl_,
               "expected " + std::to_string(expected_outputs) + " outputs, got " +
                   std::to_string(outputs.size()));
  for (size_t i = 0; i < outputs.size(); ++i)
    TROUPE_TRY(
        check_same("gather", *impl_, outputs[i], input, "outputs[" + std::to_string(i) + "]"));
  auto in_copy = input;
  return impl_->backend->gather(in_copy, outputs, root);
}

expected<void> process_group::all_to_all(const at::Tensor& input, at::Tensor& output) {
  TROUPE_GROUP_CHECK("all_to_all");
  const auto watch = impl_->watch(collective_op::all_to_all);
  TROUPE_TRY(check_tensor("all_to_all", *impl_, input, "input"));
  TROUPE_TRY(check_tensor("all_to_all", *impl_, output, "output"));
  if (input.numel() % size() != 0)
    return bad(errc::shape_mismatch, "all_to_all", *impl_,
               std::to_string(input.numel()) + " elements do not split into " +
                   std::to_string(size()) + " chunks");
  TROUPE_TRY(check_multiple("all_to_all", *impl_, output, input, 1));
  auto flat_in = input.view({-1});
  auto flat_out = output.view({-1});
  return impl_->backend->all_to_all(flat_in, flat_out);
}

namespace {

expected<void> check_tag(const char* op, const process_group::impl& g, int peer, int tag) {
  if (peer < 0 || peer >= g.backend->size() || peer == g.backend->rank())
    return bad(errc::invalid_argument, op, g,
               "peer " + std::to_string(peer) + " is not another rank");
  if (tag < 0 || tag > process_group::max_user_tag)
    return bad(errc::invalid_argument, op, g,
               "tag " + std::to_string(tag) + " outside [0, " +
                   std::to_string(process_group::max_user_tag) + "]");
  return {};
}

/// Sends and receives at once (either may be undefined), counting bytes.
expected<void> exchange_piece(process_group::impl& g, at::Tensor send, int dst, at::Tensor recv,
                              int src, int tag) {
  std::unique_ptr<pending_transfer> out, in;
  if (send.defined()) {
    auto s = g.backend->start_send(send, dst, tag);
    if (!s)
      return s.error();
    out = std::move(*s);
  }
  if (recv.defined()) {
    auto r = g.backend->start_recv(recv, src, tag);
    if (!r) {
      if (out)
        (void)out->wait();
      return r.error();
    }
    in = std::move(*r);
  }
  auto sent = out ? out->wait() : expected<void>{};
  auto got = in ? in->wait() : expected<void>{};
  if (!sent)
    return sent.error();
  if (!got)
    return got.error();
  if (send.defined())
    g.traffic.bytes_sent += static_cast<int64_t>(send.nbytes());
  if (recv.defined())
    g.traffic.bytes_received += static_cast<int64_t>(recv.nbytes());
  return {};
}

/// exchange_piece in pieces of at most piece_bytes, in order on both sides
/// (the peers of a send and its receive cut alike), noting the progress of
/// each (NOTE [calls in flight]).
expected<void> exchange(process_group::impl& g, at::Tensor send, int dst, at::Tensor recv, int src,
                        int tag) {
  auto part = [](const at::Tensor& t, std::optional<std::pair<int64_t, int64_t>> p) {
    return t.defined() && p ? t.view({-1}).narrow(0, p->first, p->second) : t;
  };
  return by_pieces(send.defined() ? send : recv, [&](std::optional<std::pair<int64_t, int64_t>> p) {
    return exchange_piece(g, part(send, p), dst, part(recv, p), src, tag);
  });
}

int wrap(int i, int n) {
  return ((i % n) + n) % n;
}

// The reduce-scatter ring in place: `work` holds N chunks of `chunk`
// elements; afterwards chunk r holds the group's reduction of it (the
// others partial sums).
expected<void> ring_reduce_in_place(process_group::impl& g, at::Tensor work, int64_t chunk,
                                    reduce_op how) {
  const int n = g.backend->size();
  const int r = g.backend->rank();
  auto incoming = at::empty({chunk}, work.options());
  auto part = [&](int c) { return work.narrow(0, int64_t{c} * chunk, chunk); };
  for (int s = 0; s + 1 < n; ++s) {
    TROUPE_TRY(exchange(g, part(wrap(r - s - 1, n)), wrap(r + 1, n), incoming, wrap(r - 1, n),
                        ring_tag));
    auto mine = part(wrap(r - s - 2, n));
    switch (native_op(how)) {
    case reduce_op::max:
      at::maximum_out(mine, mine, incoming);
      break;
    case reduce_op::min:
      at::minimum_out(mine, mine, incoming);
      break;
    default:
      mine.add_(incoming);
      break;
    }
  }
  return {};
}

// The all-gather ring in place: chunk r of `flat` is this rank's; afterwards
// every chunk is its rank's.
expected<void> ring_gather_in_place(process_group::impl& g, at::Tensor flat, int64_t chunk) {
  const int n = g.backend->size();
  const int r = g.backend->rank();
  auto part = [&](int c) { return flat.narrow(0, int64_t{c} * chunk, chunk); };
  for (int s = 0; s + 1 < n; ++s)
    TROUPE_TRY(exchange(g, part(wrap(r - s, n)), wrap(r + 1, n), part(wrap(r - s - 1, n)),
                        wrap(r - 1, n), ring_tag));
  return {};
}

expected<void> ring_reduce_scatter(process_group::impl& g, at::Tensor input, at::Tensor output,
                                   reduce_op how) {
  const int64_t chunk = output.numel();
  return guarded("reduce_scatter ring", [&]() -> expected<void> {
    auto work = input.clone();
    TROUPE_TRY(ring_reduce_in_place(g, work, chunk, how));
    output.view({-1}).copy_(work.narrow(0, int64_t{g.backend->rank()} * chunk, chunk));
    if (how == reduce_op::mean)
      output.div_(g.backend->size());
    return {};
  });
}

expected<void> ring_all_gather(process_group::impl& g, at::Tensor input, at::Tensor output) {
  const int64_t chunk = input.numel();
  auto flat = output.view({-1});
  auto placed = guarded("all_gather ring", [&] {
    flat.narrow(0, int64_t{g.backend->rank()} * chunk, chunk).copy_(input.view({-1}));
  });
  if (!placed)
    return placed;
  return ring_gather_in_place(g, flat, chunk);
}

// An all-reduce the backend cannot run (gloo has no bf16 arithmetic) as a
// reduce-scatter ring and an all-gather ring over a padded copy: each rank
// sends 2(N-1)/N of the tensor in its own dtype, the bandwidth-optimal
// volume, and the sums are done in that dtype, one rounding a hop.
expected<void> ring_all_reduce(process_group::impl& g, at::Tensor& tensor, reduce_op how) {
  const int n = g.backend->size();
  return guarded("all_reduce ring", [&]() -> expected<void> {
    auto flat = tensor.view({-1});
    const int64_t chunk = (flat.numel() + n - 1) / n;
    auto work = at::zeros({chunk * n}, flat.options());
    work.narrow(0, 0, flat.numel()).copy_(flat);
    TROUPE_TRY(ring_reduce_in_place(g, work, chunk, how));
    TROUPE_TRY(ring_gather_in_place(g, work, chunk));
    flat.copy_(work.narrow(0, 0, flat.numel()));
    return {};
  });
}

} // namespace

expected<void> process_group::reduce_scatter(const at::Tensor& input, at::Tensor& output,
                                             reduce_op how) {
  TROUPE_GROUP_CHECK("reduce_scatter");
  const auto watch = impl_->watch(collective_op::reduce_scatter);
  TROUPE_TRY(check_tensor("reduce_scatter", *impl_, input, "input"));
  TROUPE_TRY(check_tensor("reduce_scatter", *impl_, output, "output"));
  TROUPE_TRY(check_mean("reduce_scatter", *impl_, input, how));
  TROUPE_TRY(check_multiple("reduce_scatter", *impl_, input, output, size()));
  auto flat_in = input.view({-1});
  auto flat_out = output.view({-1});
  auto native = impl_->backend->reduce_scatter(flat_in, flat_out, native_op(how));
  if (native) {
    if (how == reduce_op::mean)
      return guarded("reduce_scatter mean", [&] { output.div_(size()); });
    return native;
  }
  if (code_of(native.error()) != errc::unsupported)
    return native;
  return ring_reduce_scatter(*impl_, flat_in, output, how);
}

expected<void> process_group::all_gather(const at::Tensor& input, at::Tensor& output) {
  TROUPE_GROUP_CHECK("all_gather");
  const auto watch = impl_->watch(collective_op::all_gather);
  TROUPE_TRY(check_tensor("all_gather", *impl_, input, "input"));
  TROUPE_TRY(check_tensor("all_gather", *impl_, output, "output"));
  TROUPE_TRY(check_multiple("all_gather", *impl_, output, input, size()));
  auto flat_in = input.view({-1});
  auto flat_out = output.view({-1});
  auto native = impl_->backend->all_gather(flat_in, flat_out);
  if (native || code_of(native.error()) != errc::unsupported)
    return native;
  return ring_all_gather(*impl_, flat_in, flat_out);
}

expected<void> process_group::send(const at::Tensor& tensor, int dst, int tag) {
  TROUPE_GROUP_CHECK("send");
  const auto watch = impl_->watch(collective_op::send);
  TROUPE_TRY(check_tensor("send", *impl_, tensor, "tensor"));
  TROUPE_TRY(check_tag("send", *impl_, dst, tag));
  return exchange(*impl_, tensor, dst, at::Tensor{}, -1, tag);
}

expected<void> process_group::recv(at::Tensor& tensor, int src, int tag) {
  TROUPE_GROUP_CHECK("recv");
  const auto watch = impl_->watch(collective_op::recv);
  TROUPE_TRY(check_tensor("recv", *impl_, tensor, "tensor"));
  TROUPE_TRY(check_tag("recv", *impl_, src, tag));
  return exchange(*impl_, at::Tensor{}, -1, tensor, src, tag);
}

namespace {

// NOTE [calls in flight]: a started transfer's wait is listed while it runs.
class watched_transfer final : public pending_transfer {
public:
  watched_transfer(std::unique_ptr<pending_transfer> inner, const collective_backend& b)
      : inner_(std::move(inner)), group_(b.identity()), rank_(b.rank()), size_(b.size()) {}
  expected<void> wait() override {
    const scoped_call watch{group_, rank_, size_, collective_op::wait};
    return inner_->wait();
  }

private:
  std::unique_ptr<pending_transfer> inner_;
  uint64_t group_;
  int rank_, size_;
};

expected<std::unique_ptr<pending_transfer>>
watched(expected<std::unique_ptr<pending_transfer>> started, const collective_backend& b) {
  if (!started || b.identity() == 0)
    return started;
  return std::unique_ptr<pending_transfer>{
      std::make_unique<watched_transfer>(std::move(*started), b)};
}

} // namespace

expected<std::unique_ptr<pending_transfer>> process_group::start_send(const at::Tensor& tensor,
                                                                      int dst, int tag) {
  TROUPE_GROUP_CHECK("start_send");
  TROUPE_TRY(check_tensor("start_send", *impl_, tensor, "tensor"));
  TROUPE_TRY(check_tag("start_send", *impl_, dst, tag));
  auto t = tensor;
  auto started = impl_->backend->start_send(t, dst, tag);
  if (started)
    impl_->traffic.bytes_sent += static_cast<int64_t>(tensor.nbytes());
  return watched(std::move(started), *impl_->backend);
}

expected<std::unique_ptr<pending_transfer>> process_group::start_recv(at::Tensor& tensor, int src,
                                                                      int tag) {
  TROUPE_GROUP_CHECK("start_recv");
  TROUPE_TRY(check_tensor("start_recv", *impl_, tensor, "tensor"));
  TROUPE_TRY(check_tag("start_recv", *impl_, src, tag));
  auto started = impl_->backend->start_recv(tensor, src, tag);
  if (started)
    impl_->traffic.bytes_received += static_cast<int64_t>(tensor.nbytes());
  return watched(std::move(started), *impl_->backend);
}

expected<void> broadcast_bytes(process_group& group, std::string& bytes, int root) {
  auto length = at::tensor({static_cast<int64_t>(bytes.size())}, at::kLong);
  TROUPE_TRY(group.broadcast(length, root));
  const auto n = length.item<int64_t>();
  if (n < 0)
    return make_error(errc::corrupted, "broadcast_bytes: a length of " + std::to_string(n));
  auto data = at::empty({n}, at::kByte);
  if (group.rank() == root && n > 0)
    std::memcpy(data.data_ptr(), bytes.data(), static_cast<size_t>(n));
  if (n > 0)
    TROUPE_TRY(group.broadcast(data, root));
  if (group.rank() != root)
    bytes.assign(static_cast<const char*>(data.data_ptr()), static_cast<size_t>(n));
  return {};
}

expected<process_group> process_group::split(const std::string& name,
                                             const std::vector<int>& ranks) {
  TROUPE_GROUP_CHECK("split");
  const auto watch = impl_->watch(collective_op::split);
  auto what = "split '" + name + "'";
  if (name.empty() || name.find('/') != std::string::npos)
    return bad(errc::invalid_argument, what.c_str(), *impl_,
               "a group name is non-empty, without '/'");
  bool ascending = std::adjacent_find(ranks.begin(), ranks.end(),
                                      [](int a, int b) { return a >= b; }) == ranks.end();
  if (ranks.empty() || !ascending || ranks.front() < 0 || ranks.back() >= size())
    return bad(errc::invalid_argument, what.c_str(), *impl_,
               "ranks must be ascending, distinct and in [0, " + std::to_string(size()) + ")");
  if (!std::binary_search(ranks.begin(), ranks.end(), rank()))
    return bad(errc::invalid_argument, what.c_str(), *impl_, "this rank is not a member");
  if (!impl_->subgroup_names.insert(name).second)
    return bad(errc::invalid_argument, what.c_str(), *impl_,
               "the name is already used in this group");
  auto sub = impl_->backend->subgroup(name, ranks);
  if (!sub)
    return with_prefix(sub.error(), what);
  return process_group{std::move(*sub)};
}

int rank_mesh::size() const {
  int n = 1;
  for (int d : shape)
    n *= d;
  return n;
}

std::vector<int> rank_mesh::coords(int rank) const {
  std::vector<int> out(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    out[d] = rank % shape[d];
    rank /= shape[d];
  }
  return out;
}

std::vector<int> rank_mesh::line(int rank, size_t dim) const {
  int stride = 1;
  for (size_t d = dim + 1; d < shape.size(); ++d)
    stride *= shape[d];
  int first = rank - coords(rank)[dim] * stride;
  std::vector<int> out;
  for (int i = 0; i < shape[dim]; ++i)
    out.push_back(first + i * stride);
  return out;
}

int rank_mesh::line_index(int rank, size_t dim) const {
  const auto at = coords(rank);
  int index = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    if (d != dim)
      index = index * shape[d] + at[d];
  return index;
}

expected<std::vector<process_group>> make_mesh_groups(process_group& world, const rank_mesh& mesh,
                                                      const std::vector<std::string>& names) {
  bool positive = std::all_of(mesh.shape.begin(), mesh.shape.end(), [](int d) { return d >= 1; });
  if (mesh.shape.empty() || !positive || names.size() != mesh.shape.size())
    return make_error(errc::invalid_argument,
                      "mesh groups: a shape of positive sizes with one name per dimension");
  if (mesh.size() != world.size())
    return make_error(errc::shape_mismatch,
                      "mesh groups: the mesh has " + std::to_string(mesh.size()) +
                          " ranks, the world group " + std::to_string(world.size()));
  std::vector<process_group> out;
  for (size_t d = 0; d < mesh.shape.size(); ++d) {
    auto line = mesh.line(world.rank(), d);
    std::string key = names[d];
    for (int r : line)
      key += "." + std::to_string(r);
    auto g = world.split(key, line);
    if (!g)
      return with_prefix(g.error(), "mesh dimension " + names[d]);
    out.push_back(std::move(*g));
  }
  return out;
}

} // namespace troupe::runtime
