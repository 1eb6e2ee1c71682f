// Fuzz target: a datagram on the driver's heartbeat port (NOTE
// [heartbeats], NOTE [deadlocked collectives] in cluster/heartbeats.hpp) —
// any peer on the data plane can send one. decode_heartbeat refuses
// anything that is not a heartbeat, whole; what it accepts encodes back to
// the same bytes (the form is canonical), and the deadlock rule over the
// decoded calls finds only groups whose every rank it was given.
#include "cluster/heartbeats.hpp"

#include <cstdint>
#include <cstring>
#include <set>
#include <vector>

using namespace troupe::cluster;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* bytes = reinterpret_cast<const char*>(data);
  const auto h = decode_heartbeat(bytes, size);
  if (!h)
    return 0;
  const auto again = encode_heartbeat(*h);
  if (again.size() != size || std::memcmp(again.data(), bytes, size) != 0)
    __builtin_trap();
  // The calls as two workers' reports (every rank reported twice).
  const std::vector<worker_calls> workers = {{0, h->calls}, {1, h->calls}};
  for (const auto& d : find_deadlocks(workers, 0)) {
    // Every rank of the group, at its size (two or more), was reported.
    const auto size = static_cast<int32_t>(d.ranks.size());
    std::set<int32_t> ranks;
    for (const auto& c : h->calls)
      if (c.group == d.group && c.size == size)
        ranks.insert(c.rank);
    if (size < 2 || static_cast<int32_t>(ranks.size()) != size)
      __builtin_trap();
    (void)d.describe();
  }
  return 0;
}
