#include "cluster/node_placement.hpp"

#include <algorithm>
#include <numeric>

namespace troupe::cluster {

int64_t device_slots(const node_resources& r) {
  return r.gpus > 0 ? r.gpus : std::max<int64_t>(r.cores, 1);
}

expected<std::vector<std::string>> assign_nodes(const std::vector<int64_t>& need,
                                                const std::vector<node_view>& nodes,
                                                const std::map<std::string, int64_t>& used) {
  struct candidate {
    std::string name;
    int64_t free = 0;
    int64_t slots = 0;
    bool taken = false;
  };
  std::vector<candidate> ready;
  for (const auto& n : nodes) {
    if (n.state != node_state::ready)
      continue;
    auto it = used.find(n.name);
    auto slots = device_slots(n.resources);
    ready.push_back({n.name, slots - (it == used.end() ? 0 : it->second), slots, false});
  }
  // The largest needs first, each on the ready node that fits it most
  // tightly (ties: by name, so the choice is reproducible).
  std::sort(ready.begin(), ready.end(), [](const candidate& a, const candidate& b) { return a.name < b.name; });
  std::vector<size_t> order(need.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return need[a] > need[b]; });
  std::vector<std::string> out(need.size());
  bool fits = true;
  for (auto i : order) {
    candidate* best = nullptr;
    for (auto& c : ready)
      if (!c.taken && c.free >= need[i] && (!best || c.free < best->free))
        best = &c;
    if (!best) {
      fits = false;
      break;
    }
    best->taken = true;
    out[i] = best->name;
  }
  if (fits)
    return out;
  std::string needs, have;
  for (auto n : need)
    needs += (needs.empty() ? "" : ", ") + std::to_string(n);
  for (const auto& c : ready)
    have += (have.empty() ? "" : ", ") + c.name + " (" + std::to_string(std::max<int64_t>(c.free, 0)) + " of " +
            std::to_string(c.slots) + " free)";
  return make_error(errc::unavailable, "waiting for nodes: the plan needs " + std::to_string(need.size()) +
                                           (need.size() == 1 ? " node with " : " nodes with ") + needs +
                                           " free devices; ready: " + (have.empty() ? "none" : have));
}

expected<std::string> replacement_node(const std::vector<std::string>& job_nodes,
                                       const std::vector<int64_t>& need, size_t index,
                                       const std::vector<node_view>& nodes,
                                       const std::map<std::string, int64_t>& used) {
  if (index >= job_nodes.size() || index >= need.size())
    return make_error(errc::out_of_range, "node " + std::to_string(index) + " of a plan of " +
                                              std::to_string(job_nodes.size()) + " nodes");
  const auto& current = job_nodes[index];
  for (const auto& n : nodes)
    if (n.name == current && n.state == node_state::ready)
      return current;
  std::vector<node_view> others;
  for (const auto& n : nodes)
    if (std::find(job_nodes.begin(), job_nodes.end(), n.name) == job_nodes.end())
      others.push_back(n);
  auto picked = assign_nodes({need[index]}, others, used);
  if (!picked)
    return make_error(errc::unavailable,
                      "node " + current + " is not ready and no other node can take its place (" +
                          context_of(picked.error()) + ")");
  return picked->front();
}

} // namespace troupe::cluster
