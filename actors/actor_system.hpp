#pragma once
// Actor-system setup shared by every troupe executable and test, and a
// round-trip probe used by `troupe env`.

#include "runtime/error.hpp"

#include <caf/actor_system_config.hpp>

#include <cstdint>
#include <vector>

namespace troupe::actors {

/// Registers troupe's error category (so CAF renders troupe errors with
/// their names) and the message types of the actors layer on `cfg`.
void configure(caf::actor_system_config& cfg);

/// Round-trip latencies of `count` request/response pairs between a scoped
/// actor and an event-based actor in one process, in microseconds, sorted.
/// Each request waits at most `timeout_ms`.
expected<std::vector<double>> measure_round_trip(caf::actor_system& sys, int count,
                                                 int64_t timeout_ms);

} // namespace troupe::actors
