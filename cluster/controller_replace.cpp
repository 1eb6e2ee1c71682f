// NOTE [replacing a worker] (job_nodes.hpp): the controller's part — which
// node takes a lost worker of a job on nodes, the StartWorker for it, the
// answer to its driver, and the wait while no node has room.

#include "cluster/controller_impl.hpp"
#include "cluster/node_placement.hpp"

#include <cstdio>

namespace troupe::cluster {

bool controller::impl::recoverable_on(const job_entry& e, const std::string& node) const {
  if (!e.asked)
    return false;
  bool any = false;
  for (const auto& w : e.asked->workers) {
    if (w.node < 0 || static_cast<size_t>(w.node) >= e.nodes.size() ||
        e.nodes[static_cast<size_t>(w.node)] != node)
      continue;
    if (!w.restartable)
      return false;
    any = true;
  }
  return any;
}

void controller::impl::on_replace(const std::string& id, const worker_entry& x) {
  std::lock_guard lock{mu};
  auto e = find(id);
  if (!e || !e->driver_alive || !e->on_nodes)
    return;
  for (const auto& r : e->replacements)
    if (r.rank == x.rank)
      return; // asked again by a link that came back: one is enough
  e->replacements.push_back(x);
  place_replacements(*e);
  cv.notify_all(); // the supervisor sends the StartWorkers
}

void controller::impl::place_replacements(job_entry& e) {
  if (e.replacements.empty() || !e.driver_alive)
    return;
  // The devices every other running job holds on each node.
  std::map<std::string, int64_t> used;
  for (const auto& [id, o] : jobs)
    if (o.get() != &e && o->driver_alive && o->on_nodes)
      for (size_t i = 0; i < o->nodes.size() && i < o->node_need.size(); ++i)
        used[o->nodes[i]] += o->node_need[i];
  const auto ready = nodes->list();
  std::vector<worker_entry> waiting;
  std::string reason;
  for (const auto& x : e.replacements)
    if (auto why = place_replacement(e, x, ready, used)) {
      waiting.push_back(x);
      if (reason.empty())
        reason = *why;
    }
  e.replacements = std::move(waiting);
  e.wait_reason = std::move(reason);
}

// Starts worker `x` of `e` again when a node can take it, and answers the
// driver (a refusal too); else why it waits.
std::optional<std::string>
controller::impl::place_replacement(job_entry& e, const worker_entry& x,
                                    const std::vector<node_view>& ready,
                                    const std::map<std::string, int64_t>& used) {
  auto answer = [&](const worker_replaced& r) {
    caf::anon_send(e.front, replace_worker_atom::value, r);
  };
  const auto rank = std::to_string(x.rank);
  if (!e.asked || x.rank < 0 || static_cast<size_t>(x.rank) >= e.asked->workers.size() ||
      x.node < 0 || static_cast<size_t>(x.node) >= e.nodes.size() ||
      e.asked->workers[static_cast<size_t>(x.rank)].node != x.node) {
    answer({x.rank, "", "",
            "worker " + rank + " on node " + std::to_string(x.node) +
                " is not one the job asked for"});
    return std::nullopt;
  }
  const auto index = static_cast<size_t>(x.node);
  auto node = replacement_node(e.nodes, e.node_need, index, ready, used);
  if (!node)
    return "worker " + rank + " (" + x.label + ") waits for a node: " + context_of(node.error());
  if (*node != e.nodes[index]) {
    std::fprintf(stderr, "troupe controller: job %s: node %s takes the place of lost node %s\n",
                 e.rec.id.c_str(), node->c_str(), e.nodes[index].c_str());
    auto moved = e.nodes;
    moved[index] = *node;
    if (!write_nodes(e, moved)) { // nodes.json: a re-attached driver's nodes
      answer({x.rank, "", "", e.wait_reason});
      return std::nullopt;
    }
    e.nodes = std::move(moved);
  }
  const auto& w = *e.asked;
  worker_start s{e.rec.id,
                 x.rank,
                 static_cast<int32_t>(w.workers.size()),
                 w.workers[static_cast<size_t>(x.rank)].label,
                 w.driver,
                 w.cwd,
                 w.timeout_ms};
  std::string host;
  for (const auto& n : ready)
    if (n.name == *node)
      host = n.address;
  replacement_sends.push_back({e.rec.id, x, *node, s, e.front, {x.rank, *node, host, ""}});
  return std::nullopt;
}

void controller::impl::give_up_replacements(const std::string& id, const std::string& why) {
  std::lock_guard lock{mu};
  auto e = find(id);
  if (!e)
    return;
  for (const auto& x : std::exchange(e->replacements, {}))
    caf::anon_send(e->front, replace_worker_atom::value, worker_replaced{x.rank, "", "", why});
  e->wait_reason.clear();
}

void controller::impl::send_replacements(const std::vector<replacement_send>& sends) {
  for (const auto& m : sends) {
    if (nodes->send(m.node, m.start)) {
      caf::anon_send(m.front, replace_worker_atom::value, m.answer);
      continue;
    }
    // The node went as it was picked: another is picked at the next news
    // (the node's loss, at the latest).
    std::lock_guard lock{mu};
    if (auto e = find(m.job); e && e->driver_alive)
      e->replacements.push_back(m.entry);
  }
}

} // namespace troupe::cluster
