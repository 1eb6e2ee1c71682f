#include "cluster/heartbeats.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

namespace troupe::cluster {

namespace {

constexpr uint32_t heartbeat_magic = 0x74726862; // "trhb"
constexpr size_t heartbeat_size = 16;

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
  std::string out;
  put_be(out, heartbeat_magic, 4);
  put_be(out, static_cast<uint32_t>(h.rank), 4);
  put_be(out, static_cast<uint64_t>(h.pid), 8);
  return out;
}

std::optional<heartbeat> decode_heartbeat(const char* data, size_t size) {
  if (size != heartbeat_size || get_be(data, 4) != heartbeat_magic)
    return std::nullopt;
  heartbeat h;
  h.rank = static_cast<int32_t>(static_cast<uint32_t>(get_be(data + 4, 4)));
  h.pid = static_cast<int64_t>(get_be(data + 8, 8));
  if (h.rank < 0 || h.pid <= 0)
    return std::nullopt;
  return h;
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
  char buf[64];
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
  std::thread([fd, to = *addr, beat = encode_heartbeat(h), every] {
    while (true) {
      // (A lost datagram is the next one's to make up for.)
      (void)::sendto(fd, beat.data(), beat.size(), MSG_NOSIGNAL,
                     reinterpret_cast<const sockaddr*>(&to.first), to.second);
      std::this_thread::sleep_for(every);
    }
  }).detach();
  return {};
}

} // namespace troupe::cluster
