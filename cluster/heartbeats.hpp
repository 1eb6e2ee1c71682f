#pragma once
// NOTE [heartbeats]: a worker process tells its driver that it runs by a
// UDP datagram (its rank and pid) eight times each heartbeat interval,
// sent by a thread of its own; the driver's watchdog (workers.cpp) drains
// them and kills a worker silent for 2 intervals as hung (stopped,
// swapping) — found within 3 intervals. Datagrams, not CAF messages: a
// worker's connection to the driver carries its replies too, and a large
// one (a trainer's state, hundreds of MB, as a checkpoint gathers it)
// holds a ping's answer behind it for seconds, which a busy worker must
// not be killed for. They travel on the job's data plane (docs/cluster.md:
// a trusted network); a datagram that is not one is ignored.

#include "runtime/error.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe::cluster {

struct heartbeat {
  int32_t rank = 0;
  int64_t pid = 0;
};

/// A heartbeat as sent, and read back (nullopt: not a heartbeat).
std::string encode_heartbeat(const heartbeat& h);
std::optional<heartbeat> decode_heartbeat(const char* data, size_t size);

/// The driver's end: a UDP socket on `host` (an IP address), port chosen.
class heartbeat_receiver {
public:
  static expected<heartbeat_receiver> open(const std::string& host);
  heartbeat_receiver() = default;
  heartbeat_receiver(heartbeat_receiver&& o) noexcept;
  heartbeat_receiver& operator=(heartbeat_receiver&& o) noexcept;
  heartbeat_receiver(const heartbeat_receiver&) = delete;
  heartbeat_receiver& operator=(const heartbeat_receiver&) = delete;
  ~heartbeat_receiver();

  uint16_t port() const { return port_; }
  /// The heartbeats that arrived since the last call, without waiting.
  std::vector<heartbeat> drain();

private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

/// The worker's end: a detached thread that sends `h` to host:port every
/// `every` for the rest of the process's life.
expected<void> start_heartbeats(const std::string& host, uint16_t port, heartbeat h,
                                std::chrono::milliseconds every);

} // namespace troupe::cluster
