#pragma once
// Names a peer gives to numbers troupe logs (a reward service's extras, an
// environment's info): they become metric names — in metrics.jsonl,
// Prometheus and the dashboard — so they are checked before use.

#include <cstddef>
#include <string>
#include <string_view>

namespace troupe::runtime {

/// The longest name a peer may give a metric.
inline constexpr size_t max_peer_metric_name = 64;

/// Why `name` cannot name a metric — "" when it can: 1 to
/// max_peer_metric_name bytes of letters, digits and `_ . - /`.
std::string peer_metric_name_why(std::string_view name);

} // namespace troupe::runtime
