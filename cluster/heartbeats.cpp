#include "cluster/heartbeats.hpp"

#include "runtime/hash.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <thread>
#include <utility>

namespace troupe::cluster {

namespace {

constexpr uint32_t heartbeat_magic = 0x74726862;       // "trhb": rank, pid
constexpr uint32_t heartbeat_calls_magic = 0x74726863; // "trhc": rank, pid, calls
constexpr size_t heartbeat_size = 16;
// NOTE [deadlocked collectives]: after rank and pid, a count and per call
// its group (8 bytes), rank, size, age in ms and op (4 bytes each).
constexpr size_t call_size = 24;
constexpr size_t calls_header_size = heartbeat_size + 4;

void put_be(std::string& out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t get_be(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// The socket address of `host` (an IPv4 or IPv6 literal) and `port`.
expected<std::pair<sockaddr_storage, socklen_t>> address_of(const std::string& host,
                                                            uint16_t port) {
  sockaddr_storage a{};
  auto* v4 = reinterpret_cast<sockaddr_in*>(&a);
  if (::inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(port);
    return std::make_pair(a, static_cast<socklen_t>(sizeof(sockaddr_in)));
  }
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&a);
  if (::inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    return std::make_pair(a, static_cast<socklen_t>(sizeof(sockaddr_in6)));
  }
  return make_error(errc::invalid_argument, "heartbeats: '" + host + "' is not an IP address");
}

caf::error os_error(const std::string& what) {
  return make_error(errc::io_error, "heartbeats: " + what + ": " + std::strerror(errno));
}

} // namespace

std::string encode_heartbeat(const heartbeat& h) {
  const auto n = std::min(h.calls.size(), heartbeat::max_calls);
  std::string out;
  put_be(out, n == 0 ? heartbeat_magic : heartbeat_calls_magic, 4);
  put_be(out, static_cast<uint32_t>(h.rank), 4);
  put_be(out, static_cast<uint64_t>(h.pid), 8);
  if (n == 0)
    return out;
  put_be(out, n, 4);
  for (size_t i = 0; i < n; ++i) {
    const auto& c = h.calls[i];
    put_be(out, c.group, 8);
    put_be(out, static_cast<uint32_t>(c.rank), 4);
    put_be(out, static_cast<uint32_t>(c.size), 4);
    put_be(out, static_cast<uint64_t>(std::clamp<int64_t>(c.age_ms, 0, UINT32_MAX)), 4);
    put_be(out, static_cast<uint8_t>(c.op), 4);
  }
  return out;
}

namespace {

// One call of a datagram; nullopt when a field is out of range.
std::optional<runtime::call_in_flight> decode_call(const char* p) {
  runtime::call_in_flight c;
  c.group = get_be(p, 8);
  const auto rank = get_be(p + 8, 4), size = get_be(p + 12, 4), op = get_be(p + 20, 4);
  c.age_ms = static_cast<int64_t>(get_be(p + 16, 4));
  if (c.group == 0 || size == 0 || size > INT32_MAX || rank >= size ||
      op >= enum_names(runtime::collective_op{}).size())
    return std::nullopt;
  c.rank = static_cast<int32_t>(rank);
  c.size = static_cast<int32_t>(size);
  c.op = static_cast<runtime::collective_op>(op);
  return c;
}

} // namespace

std::optional<heartbeat> decode_heartbeat(const char* data, size_t size) {
  if (size < heartbeat_size)
    return std::nullopt;
  const auto magic = get_be(data, 4);
  heartbeat h;
  h.rank = static_cast<int32_t>(static_cast<uint32_t>(get_be(data + 4, 4)));
  h.pid = static_cast<int64_t>(get_be(data + 8, 8));
  if (h.rank < 0 || h.pid <= 0)
    return std::nullopt;
  if (magic == heartbeat_magic)
    return size == heartbeat_size ? std::optional{h} : std::nullopt;
  if (magic != heartbeat_calls_magic || size < calls_header_size)
    return std::nullopt;
  const auto n = get_be(data + heartbeat_size, 4);
  if (n == 0 || n > heartbeat::max_calls || size != calls_header_size + n * call_size)
    return std::nullopt;
  for (size_t i = 0; i < n; ++i) {
    auto c = decode_call(data + calls_header_size + i * call_size);
    if (!c)
      return std::nullopt;
    h.calls.push_back(*c);
  }
  return h;
}

int64_t deadlock::stuck_ms() const {
  int64_t out = INT64_MAX;
  for (const auto& m : ranks)
    out = std::min(out, m.age_ms);
  return ranks.empty() ? 0 : out;
}

std::string deadlock::describe() const {
  std::string out = "every rank of collective group " + runtime::hex64(group) + " (" +
                    std::to_string(ranks.size()) +
                    " ranks) has been inside it for >= " + std::to_string(stuck_ms()) + " ms:";
  for (size_t r = 0; r < ranks.size(); ++r)
    out += std::string{r ? "," : ""} + " rank " + std::to_string(r) + " in " +
           std::string{to_string(ranks[r].op)} + " on worker " + std::to_string(ranks[r].worker);
  return out;
}

std::vector<deadlock> find_deadlocks(const std::vector<worker_calls>& workers, int64_t min_age_ms) {
  // (group, size) → rank → member. A group of one rank waits for no one:
  // it is never deadlocked (and a forged report of one cannot kill).
  std::map<std::pair<uint64_t, int32_t>, std::map<int32_t, deadlock::member>> seen;
  for (const auto& w : workers)
    for (const auto& c : w.calls)
      if (c.age_ms >= min_age_ms && c.size >= 2 && c.rank >= 0 && c.rank < c.size)
        seen[{c.group, c.size}].emplace(c.rank, deadlock::member{w.worker, c.op, c.age_ms});
  std::vector<deadlock> out;
  for (const auto& [key, members] : seen) {
    if (static_cast<int32_t>(members.size()) != key.second)
      continue; // (ranks are in [0, size): as many as size means every one)
    deadlock d{key.first, {}};
    for (const auto& [rank, m] : members)
      d.ranks.push_back(m);
    out.push_back(std::move(d));
  }
  return out;
}

expected<heartbeat_receiver> heartbeat_receiver::open(const std::string& host) {
  auto addr = address_of(host, 0);
  if (!addr)
    return addr.error();
  heartbeat_receiver r;
  r.fd_ = ::socket(addr->first.ss_family, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (r.fd_ < 0)
    return os_error("socket");
  if (::bind(r.fd_, reinterpret_cast<const sockaddr*>(&addr->first), addr->second) != 0)
    return os_error("bind " + host);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  if (::getsockname(r.fd_, reinterpret_cast<sockaddr*>(&bound), &len) != 0)
    return os_error("getsockname");
  r.port_ = ntohs(bound.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                                             : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  return r;
}

heartbeat_receiver::heartbeat_receiver(heartbeat_receiver&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), port_(o.port_) {}

heartbeat_receiver& heartbeat_receiver::operator=(heartbeat_receiver&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0)
      ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    port_ = o.port_;
  }
  return *this;
}

heartbeat_receiver::~heartbeat_receiver() {
  if (fd_ >= 0)
    ::close(fd_);
}

std::vector<heartbeat> heartbeat_receiver::drain() {
  std::vector<heartbeat> out;
  if (fd_ < 0)
    return out;
  char buf[512];
  while (true) {
    auto n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n < 0)
      break; // nothing more now (or an error: the next tick tries again)
    if (auto h = decode_heartbeat(buf, static_cast<size_t>(n)))
      out.push_back(*h);
  }
  return out;
}

expected<void> start_heartbeats(const std::string& host, uint16_t port, heartbeat h,
                                std::chrono::milliseconds every) {
  auto addr = address_of(host, port);
  if (!addr)
    return addr.error();
  int fd = ::socket(addr->first.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return os_error("socket");
  std::thread([fd, to = *addr, h, every]() mutable {
    while (true) {
      h.calls = runtime::calls_in_flight(heartbeat::max_calls);
      const auto beat = encode_heartbeat(h);
      // (A lost datagram is the next one's to make up for.)
      (void)::sendto(fd, beat.data(), beat.size(), MSG_NOSIGNAL,
                     reinterpret_cast<const sockaddr*>(&to.first), to.second);
      std::this_thread::sleep_for(every);
    }
  }).detach();
  return {};
}

} // namespace troupe::cluster
