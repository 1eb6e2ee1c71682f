#pragma once
// In-process ranks for tests: each rank of a local group runs on its own
// thread, as a rank of a real job runs in its own actor or process.
#include <functional>
#include <future>
#include <type_traits>
#include <vector>

namespace troupe::testing {

/// Runs `body(groups[r])` for every rank at once; returns each rank's result
/// in rank order.
template <class T, class Group>
std::vector<T> on_every_rank(std::vector<Group>& groups,
                             const std::function<T(std::type_identity_t<Group>&)>& body) {
  std::vector<std::future<T>> runs;
  for (auto& g : groups)
    runs.push_back(std::async(std::launch::async, [&body, &g] { return body(g); }));
  std::vector<T> out;
  for (auto& r : runs)
    out.push_back(r.get());
  return out;
}

} // namespace troupe::testing
