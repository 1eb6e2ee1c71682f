#include "runtime/collectives.hpp"

#include "runtime/inflight.hpp"

#include "runtime/torch_guard.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <future>

namespace troupe::runtime {

struct store::impl {
  c10::intrusive_ptr<c10d::Store> store;
  uint16_t port = 0;
  std::chrono::milliseconds timeout{30000};
};

store::store() = default;
store::~store() = default;
store::store(store&&) noexcept = default;
store& store::operator=(store&&) noexcept = default;

uint16_t store::port() const {
  return impl_ ? impl_->port : 0;
}

expected<void> store::set(const std::string& key, const std::string& value) {
  if (!impl_)
    return make_error(errc::invalid_argument, "store::set on an empty store");
  return guarded("store set '" + key + "'", [&] {
    impl_->store->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  });
}

expected<std::string> store::get(const std::string& key) {
  if (!impl_)
    return make_error(errc::invalid_argument, "store::get on an empty store");
  auto res = guarded("store get '" + key + "'", [&] {
    impl_->store->wait({key}, impl_->timeout);
    auto bytes = impl_->store->get(key);
    return std::string(bytes.begin(), bytes.end());
  });
  if (!res && context_of(res.error()).find("imeout") != std::string::npos)
    return make_error(errc::timeout, context_of(res.error()));
  return res;
}

expected<store> make_tcp_store(const store_options& options) {
  if (options.timeout_ms <= 0)
    return make_error(errc::invalid_argument, "store timeout_ms must be positive");
  if (!options.is_server && options.port == 0)
    return make_error(errc::invalid_argument, "a store client needs the server's port");
  auto what = std::string{options.is_server ? "starting" : "connecting to"} + " TCPStore at " +
              options.host + ":" + std::to_string(options.port);
  return guarded(what, [&] {
    c10d::TCPStoreOptions opts;
    opts.port = options.port;
    opts.isServer = options.is_server;
    opts.waitWorkers = false;
    opts.timeout = std::chrono::milliseconds(options.timeout_ms);
    auto tcp = c10::make_intrusive<c10d::TCPStore>(options.host, opts);
    store out;
    out.impl_ = std::make_unique<store::impl>();
    out.impl_->port = tcp->getPort();
    out.impl_->timeout = opts.timeout;
    out.impl_->store = tcp;
    return out;
  });
}

namespace {

/// A c10d failure as a troupe error: a wait that expired is errc::timeout,
/// a peer's connection that closed errc::unavailable.
caf::error classify(const caf::error& err) {
  auto text = context_of(err);
  auto has = [&](const char* s) { return text.find(s) != std::string::npos; };
  if (has("imeout") || has("imed out") || has("did not complete"))
    return make_error(errc::timeout, text);
  if (has("onnection") || has("closed") || has("reset by peer") || has("Broken pipe"))
    return make_error(errc::unavailable, text);
  return err;
}

expected<void> wait_work(const c10::intrusive_ptr<c10d::Work>& work, const std::string& what,
                         std::chrono::milliseconds timeout) {
  auto done = guarded(what, [&] {
    if (!work->wait(timeout))
      throw std::runtime_error("did not complete");
  });
  if (!done)
    return classify(done.error());
  return done;
}

c10d::ReduceOp c10d_op(reduce_op op) {
  switch (op) {
    case reduce_op::max: return c10d::ReduceOp::MAX;
    case reduce_op::min: return c10d::ReduceOp::MIN;
    default: return c10d::ReduceOp::SUM;
  }
}

class gloo_transfer final : public pending_transfer {
public:
  gloo_transfer(c10::intrusive_ptr<c10d::Work> work, std::string what, std::chrono::milliseconds timeout)
    : work_(std::move(work)), what_(std::move(what)), timeout_(timeout) {}
  expected<void> wait() override { return wait_work(work_, what_, timeout_); }

private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
  std::chrono::milliseconds timeout_;
};

/// NOTE [gloo and bf16]: LibTorch 1.13's gloo has no bf16 (its dtype list
/// stops at half). Moving data needs only the bits, so broadcast, gather,
/// scatter and all-to-all send a bf16 tensor as half of the same bytes;
/// arithmetic is refused as unsupported, and process_group runs a bf16
/// all-reduce as rings on send / recv, a reduce in fp32.
at::Tensor as_gloo_bits(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t;
}

expected<void> gloo_reduces(const at::Tensor& t, const char* op) {
  if (t.scalar_type() == at::kBFloat16)
    return make_error(errc::unsupported, std::string{op} + ": gloo has no bf16 arithmetic");
  return {};
}

/// c10d's ProcessGroupGloo as a collective_backend. Sub-groups share the
/// parent's store under a nested prefix and its gloo devices.
class gloo_backend final : public collective_backend {
public:
  gloo_backend(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::ProcessGroupGloo> pg,
               int rank, int size, std::chrono::milliseconds timeout, uint64_t identity)
      : store_(std::move(store)), pg_(std::move(pg)), rank_(rank), size_(size), timeout_(timeout),
        identity_(identity) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  uint64_t identity() const override { return identity_; }

  expected<void> all_reduce(at::Tensor& tensor, reduce_op op) override {
    if (auto ok = gloo_reduces(tensor, "all_reduce"); !ok)
      return ok;
    std::vector<at::Tensor> ts{tensor};
    c10d::AllreduceOptions o;
    o.reduceOp = c10d_op(op);
    return run("all_reduce", [&] { return pg_->allreduce(ts, o); });
  }
  expected<void> broadcast(at::Tensor& tensor, int root) override {
    std::vector<at::Tensor> ts{as_gloo_bits(tensor)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    return run("broadcast", [&] { return pg_->broadcast(ts, o); });
  }
  expected<void> reduce(at::Tensor& tensor, int root, reduce_op op) override {
    if (auto ok = gloo_reduces(tensor, "reduce"); !ok)
      return ok;
    std::vector<at::Tensor> ts{tensor};
    c10d::ReduceOptions o;
    o.rootRank = root;
    o.reduceOp = c10d_op(op);
    return run("reduce", [&] { return pg_->reduce(ts, o); });
  }
  expected<void> gather(at::Tensor& input, std::vector<at::Tensor>& outputs, int root) override {
    std::vector<at::Tensor> in{as_gloo_bits(input)};
    std::vector<std::vector<at::Tensor>> out;
    if (rank_ == root)
      out.push_back(bits_of(outputs));
    c10d::GatherOptions o;
    o.rootRank = root;
    return run("gather", [&] { return pg_->gather(out, in, o); });
  }
  expected<void> scatter(std::vector<at::Tensor>& inputs, at::Tensor& output, int root) override {
    std::vector<at::Tensor> out{as_gloo_bits(output)};
    std::vector<std::vector<at::Tensor>> in;
    if (rank_ == root)
      in.push_back(bits_of(inputs));
    c10d::ScatterOptions o;
    o.rootRank = root;
    return run("scatter", [&] { return pg_->scatter(out, in, o); });
  }
  expected<void> all_to_all(at::Tensor& input, at::Tensor& output) override {
    std::vector<int64_t> equal_split;
    auto out = as_gloo_bits(output), in = as_gloo_bits(input);
    return run("all_to_all", [&] { return pg_->alltoall_base(out, in, equal_split, equal_split); });
  }
  expected<void> barrier() override {
    return run("barrier", [&] { return pg_->barrier(); });
  }
  expected<std::unique_ptr<pending_transfer>> start_send(at::Tensor& tensor, int dst, int tag) override {
    return start("send to " + std::to_string(dst), [&] {
      std::vector<at::Tensor> ts{tensor};
      return pg_->send(ts, dst, tag);
    });
  }
  expected<std::unique_ptr<pending_transfer>> start_recv(at::Tensor& tensor, int src, int tag) override {
    return start("recv from " + std::to_string(src), [&] {
      std::vector<at::Tensor> ts{tensor};
      return pg_->recv(ts, src, tag);
    });
  }
  expected<std::unique_ptr<collective_backend>> subgroup(const std::string& name,
                                                         const std::vector<int>& ranks) override {
    int sub_rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin());
    return guarded("creating gloo sub-group '" + name + "'", [&]() -> std::unique_ptr<collective_backend> {
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>(name, store_);
      auto opts = c10d::ProcessGroupGloo::Options::create();
      opts->timeout = timeout_;
      opts->devices = pg_->getOptions()->devices;
      auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, sub_rank,
                                                            static_cast<int>(ranks.size()), opts);
      return std::make_unique<gloo_backend>(prefixed, pg, sub_rank, static_cast<int>(ranks.size()),
                                            timeout_, group_identity(identity_, name));
    });
  }

private:
  static std::vector<at::Tensor> bits_of(const std::vector<at::Tensor>& ts) {
    std::vector<at::Tensor> out;
    for (const auto& t : ts)
      out.push_back(as_gloo_bits(t));
    return out;
  }
  template <class F>
  expected<void> run(const char* what, F&& start_work) {
    auto work = guarded(what, std::forward<F>(start_work));
    if (!work)
      return classify(work.error());
    return wait_work(*work, what, timeout_);
  }
  template <class F>
  expected<std::unique_ptr<pending_transfer>> start(std::string what, F&& start_work) {
    auto work = guarded(what, std::forward<F>(start_work));
    if (!work)
      return classify(work.error());
    return std::unique_ptr<pending_transfer>{std::make_unique<gloo_transfer>(*work, what, timeout_)};
  }

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  uint64_t identity_;
};

} // namespace

expected<process_group> make_process_group(store& rendezvous, const group_options& options) {
  if (!rendezvous.impl_)
    return make_error(errc::invalid_argument, "process group '" + options.name + "': empty store");
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size)
    return make_error(errc::invalid_argument,
                      "process group '" + options.name + "': rank " + std::to_string(options.rank) +
                        " outside world of size " + std::to_string(options.world_size));
  if (options.backend != "gloo")
    return make_error(errc::unsupported, "process group '" + options.name + "': backend '" +
                                           options.backend + "' is not available in this build");
  return guarded("creating gloo group '" + options.name + "'", [&] {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(options.name, rendezvous.impl_->store);
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->timeout = std::chrono::milliseconds(options.timeout_ms);
    opts->devices.push_back(
      c10d::ProcessGroupGloo::createDeviceForHostname(options.interface_host));
    auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, options.rank,
                                                          options.world_size, opts);
    // NOTE [calls in flight]: the store's port and the key prefix name
    // the group alike on every rank.
    const auto identity = group_identity(0, std::to_string(rendezvous.port()) + "/" + options.name);
    return process_group{std::make_unique<gloo_backend>(
        prefixed, pg, options.rank, options.world_size, opts->timeout, identity)};
  });
}

expected<local_groups> make_local_groups(int world, const group_options& options) {
  if (world < 1)
    return make_error(errc::invalid_argument,
                      "make_local_groups: world " + std::to_string(world) + " < 1");
  local_groups out;
  store_options so;
  so.is_server = true;
  so.timeout_ms = options.timeout_ms;
  auto server = make_tcp_store(so);
  if (!server)
    return server.error();
  out.stores.push_back(std::move(*server));
  for (int r = 1; r < world; ++r) {
    store_options co;
    co.port = out.stores.front().port();
    co.timeout_ms = options.timeout_ms;
    auto client = make_tcp_store(co);
    if (!client)
      return client.error();
    out.stores.push_back(std::move(*client));
  }
  // Every rank must join at once: one thread per rank.
  std::vector<std::future<expected<process_group>>> joins;
  for (int r = 0; r < world; ++r)
    joins.push_back(std::async(std::launch::async, [&out, &options, r, world] {
      auto o = options;
      o.rank = r;
      o.world_size = world;
      return make_process_group(out.stores[static_cast<size_t>(r)], o);
    }));
  caf::error first;
  for (auto& j : joins) {
    auto g = j.get();
    if (!g) {
      if (!first)
        first = g.error();
      continue;
    }
    out.groups.push_back(std::move(*g));
  }
  if (first)
    return first;
  return out;
}

expected<store> connect_tcp_store(const std::string& address, int64_t timeout_ms) {
  auto colon = address.rfind(':');
  int port = 0;
  if (colon != std::string::npos && colon > 0 && colon + 1 < address.size() &&
      address.find_first_not_of("0123456789", colon + 1) == std::string::npos &&
      address.size() - colon - 1 <= 5)
    port = std::stoi(address.substr(colon + 1));
  if (port < 1 || port > 65535)
    return make_error(errc::invalid_argument, "store address '" + address + "': expected host:port");
  store_options o;
  o.host = address.substr(0, colon);
  o.port = static_cast<uint16_t>(port);
  o.timeout_ms = timeout_ms;
  return make_tcp_store(o);
}

std::vector<std::string> available_backends() {
  std::vector<std::string> out{"gloo"};
#if defined(TROUPE_TORCH_CUDA)
  out.emplace_back("nccl");
#endif
  return out;
}

} // namespace troupe::runtime
