#include "runtime/collectives.hpp"

#include "runtime/torch_guard.hpp"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <chrono>
#include <future>

namespace troupe::runtime {

struct store::impl {
  c10::intrusive_ptr<c10d::Store> store;
  uint16_t port = 0;
  std::chrono::milliseconds timeout{30000};
};

struct process_group::impl {
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  int rank = 0;
  int size = 1;
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

process_group::process_group() = default;
process_group::~process_group() = default;
process_group::process_group(process_group&&) noexcept = default;
process_group& process_group::operator=(process_group&&) noexcept = default;

int process_group::rank() const {
  return impl_ ? impl_->rank : 0;
}

int process_group::size() const {
  return impl_ ? impl_->size : 0;
}

namespace {

expected<void> wait_work(const c10::intrusive_ptr<c10d::Work>& work, const char* what,
                         std::chrono::milliseconds timeout) {
  return guarded(what, [&] {
    if (!work->wait(timeout))
      throw std::runtime_error("did not complete");
  });
}

} // namespace

expected<void> process_group::all_reduce_sum(at::Tensor& tensor) {
  if (!impl_)
    return make_error(errc::invalid_argument, "all_reduce on an empty process group");
  std::vector<at::Tensor> ts{tensor};
  auto work = guarded("all_reduce", [&] { return impl_->pg->allreduce(ts); });
  if (!work)
    return work.error();
  return wait_work(*work, "all_reduce", impl_->timeout);
}

expected<void> process_group::broadcast(at::Tensor& tensor, int root) {
  if (!impl_)
    return make_error(errc::invalid_argument, "broadcast on an empty process group");
  if (root < 0 || root >= impl_->size)
    return make_error(errc::invalid_argument, "broadcast root " + std::to_string(root) +
                                                " outside [0, " + std::to_string(impl_->size) + ")");
  std::vector<at::Tensor> ts{tensor};
  c10d::BroadcastOptions opts;
  opts.rootRank = root;
  auto work = guarded("broadcast", [&] { return impl_->pg->broadcast(ts, opts); });
  if (!work)
    return work.error();
  return wait_work(*work, "broadcast", impl_->timeout);
}

expected<void> process_group::barrier() {
  if (!impl_)
    return make_error(errc::invalid_argument, "barrier on an empty process group");
  auto work = guarded("barrier", [&] { return impl_->pg->barrier(); });
  if (!work)
    return work.error();
  return wait_work(*work, "barrier", impl_->timeout);
}

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
    process_group out;
    out.impl_ = std::make_unique<process_group::impl>();
    out.impl_->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, options.rank,
                                                                options.world_size, opts);
    out.impl_->rank = options.rank;
    out.impl_->size = options.world_size;
    out.impl_->timeout = std::chrono::milliseconds(options.timeout_ms);
    return out;
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
