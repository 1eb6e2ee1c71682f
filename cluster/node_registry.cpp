#include "cluster/node_registry.hpp"

#include <cctype>
#include <utility>

namespace troupe::cluster {

std::string host_of_peer(const std::string& peer) {
  auto colon = peer.find(':');
  if (colon == std::string::npos)
    return {};
  auto scheme = peer.substr(0, colon);
  auto rest = peer.substr(colon + 1);
  if (scheme == "ipv6" && !rest.empty() && rest.front() == '[') {
    auto close = rest.find(']');
    return close == std::string::npos ? std::string{} : rest.substr(1, close - 1);
  }
  if (scheme != "ipv4")
    return {};
  auto port = rest.rfind(':');
  return port == std::string::npos ? std::string{} : rest.substr(0, port);
}

bool valid_node_name(std::string_view name) {
  if (name.empty() || name.size() > 63)
    return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'))
      return false;
  return true;
}

node_registry::node_registry(node_options o) : opt_(o) {}

expected<uint64_t> node_registry::join(const node_hello& h, const std::string& peer, closer close,
                                       int64_t now_us, sender send) {
  if (!valid_node_name(h.name))
    return make_error(errc::invalid_argument,
                      "name: '" + h.name.substr(0, 80) + "' is not a node name ([A-Za-z0-9._-], 1 to 63)");
  auto address = h.advertise_host.empty() ? host_of_peer(peer) : h.advertise_host;
  if (address.empty() || address.size() > 253 ||
      address.find_first_of(" \t\r\n/\\'\"`$;&|<>") != std::string::npos)
    return make_error(errc::invalid_argument,
                      "advertise_host: '" + address.substr(0, 80) + "' is not a host name or address");
  if (h.resources.cores < 0 || h.resources.memory_bytes < 0 || h.resources.gpus < 0)
    return make_error(errc::invalid_argument, "resources: negative counts");
  std::unique_lock lock{mu_};
  auto it = nodes_.find(h.name);
  if (it != nodes_.end() && it->second.view.state == node_state::ready)
    return make_error(errc::illegal_state, "name: node '" + h.name + "' is already joined (from " +
                                                it->second.view.peer +
                                                "); give this agent another --name");
  entry e;
  e.view.name = h.name;
  e.view.state = node_state::ready;
  e.view.address = address;
  e.view.peer = peer;
  e.view.resources = h.resources;
  e.view.joined_time_us = now_us;
  e.view.last_heartbeat_us = now_us;
  e.view.state_time_us = now_us;
  e.view.version = h.version.substr(0, 64);
  e.view.agent_pid = h.pid;
  e.session = next_session_++;
  e.close = std::move(close);
  e.send = std::move(send);
  auto id = e.session;
  auto view = e.view;
  nodes_[h.name] = std::move(e);
  auto listeners = joined_listeners_;
  lock.unlock();
  for (const auto& f : listeners)
    f(view);
  return id;
}

node_registry::entry* node_registry::by_session(uint64_t session) {
  for (auto& [name, e] : nodes_)
    if (e.session == session && e.view.state == node_state::ready)
      return &e;
  return nullptr;
}

void node_registry::heartbeat(uint64_t session, int64_t now_us) {
  std::lock_guard lock{mu_};
  if (auto* e = by_session(session))
    e->view.last_heartbeat_us = now_us;
}

void node_registry::leave(uint64_t session, const std::string& reason, int64_t now_us) {
  std::lock_guard lock{mu_};
  if (auto* e = by_session(session)) {
    e->view.state = node_state::left;
    e->view.reason = reason.empty() ? "the agent left" : reason.substr(0, 200);
    e->view.state_time_us = now_us;
    e->close = nullptr;
    e->send = nullptr;
  }
}

std::function<void()> node_registry::lose(entry& e, const std::string& reason, int64_t now_us) {
  e.view.state = node_state::lost;
  e.view.state_time_us = now_us;
  e.view.reason = reason;
  e.send = nullptr;
  return [view = e.view, closer = std::exchange(e.close, nullptr), listeners = lost_listeners_] {
    if (closer)
      closer(view.reason);
    for (const auto& f : listeners)
      f(view);
  };
}

void node_registry::disconnected(uint64_t session, const std::string& reason, int64_t now_us) {
  std::function<void()> after;
  {
    std::lock_guard lock{mu_};
    if (auto* e = by_session(session)) {
      e->close = nullptr; // its stream has ended already
      after = lose(*e, reason, now_us);
    }
  }
  if (after)
    after();
}

std::vector<std::string> node_registry::sweep(int64_t now_us) {
  std::vector<std::function<void()>> after;
  std::vector<std::string> names;
  {
    std::lock_guard lock{mu_};
    for (auto& [name, e] : nodes_) {
      auto silent_ms = (now_us - e.view.last_heartbeat_us) / 1000;
      if (e.view.state != node_state::ready || silent_ms < opt_.lost_after_ms)
        continue;
      after.push_back(lose(e, "no heartbeat for " + std::to_string(silent_ms) + " ms", now_us));
      names.push_back(name);
    }
  }
  for (auto& f : after)
    f();
  return names;
}

std::vector<node_view> node_registry::list() const {
  std::lock_guard lock{mu_};
  std::vector<node_view> out;
  for (const auto& [name, e] : nodes_)
    out.push_back(e.view);
  return out;
}

std::optional<node_view> node_registry::find(const std::string& name) const {
  std::lock_guard lock{mu_};
  auto it = nodes_.find(name);
  if (it == nodes_.end())
    return std::nullopt;
  return it->second.view;
}

void node_registry::on_lost(std::function<void(const node_view&)> f) {
  std::lock_guard lock{mu_};
  lost_listeners_.push_back(std::move(f));
}

void node_registry::on_joined(std::function<void(const node_view&)> f) {
  std::lock_guard lock{mu_};
  joined_listeners_.push_back(std::move(f));
}

bool node_registry::send(const std::string& name, const node_command& c) {
  sender s;
  {
    std::lock_guard lock{mu_};
    auto it = nodes_.find(name);
    if (it == nodes_.end() || it->second.view.state != node_state::ready)
      return false;
    s = it->second.send;
  }
  return s && s(c);
}

void node_registry::worker_exited(uint64_t session, const worker_exit& x) {
  std::string name;
  std::vector<std::function<void(const std::string&, const worker_exit&)>> listeners;
  {
    std::lock_guard lock{mu_};
    auto* e = by_session(session);
    if (!e)
      return;
    name = e->view.name;
    listeners = exit_listeners_;
  }
  for (const auto& f : listeners)
    f(name, x);
}

void node_registry::on_worker_exit(std::function<void(const std::string&, const worker_exit&)> f) {
  std::lock_guard lock{mu_};
  exit_listeners_.push_back(std::move(f));
}

} // namespace troupe::cluster
