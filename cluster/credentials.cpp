#include "cluster/credentials.hpp"

#include "runtime/file_io.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace troupe::cluster {

expected<std::pair<std::string, int>> parse_listen_address(const std::string& address) {
  auto bad = [&](const std::string& why) {
    return make_error(errc::invalid_argument, "listen address '" + address + "': " + why);
  };
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0)
    return bad("expected HOST:PORT");
  auto host = address.substr(0, colon);
  auto port_text = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != std::string::npos)
    return bad("the port is not a number");
  int port = std::stoi(port_text);
  if (port > 65535)
    return bad("the port is above 65535");
  return std::make_pair(host, port);
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1")
    return true;
  in_addr a{};
  if (::inet_pton(AF_INET, host.c_str(), &a) == 1)
    return (ntohl(a.s_addr) >> 24) == 127;
  return false;
}

expected<std::string> make_token() {
  unsigned char bytes[32];
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return make_error(errc::io_error, std::string{"/dev/urandom: "} + std::strerror(errno));
  size_t got = 0;
  while (got < sizeof bytes) {
    auto n = ::read(fd, bytes + got, sizeof bytes - got);
    if (n <= 0) {
      ::close(fd);
      return make_error(errc::io_error, "/dev/urandom: short read");
    }
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (auto b : bytes)
    out += hex[b >> 4], out += hex[b & 15];
  return out;
}

expected<std::string> read_token_file(const std::string& path) {
  auto text = runtime::read_file(path);
  if (!text)
    return text.error();
  auto t = *text;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' '))
    t.pop_back();
  return t;
}

expected<std::string> read_secret_file(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0)
    return make_error(errc::not_found, path + ": cannot read it: " + std::strerror(errno));
  if ((st.st_mode & 077) != 0)
    return make_error(errc::invalid_argument, path + ": the file is readable by others; chmod 600 it");
  return read_token_file(path);
}

expected<std::string> load_or_create_token(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0) {
    auto t = read_secret_file(path);
    if (t && t->size() < 16)
      return make_error(errc::invalid_argument, path + ": the token is shorter than 16 characters");
    return t;
  }
  auto token = make_token();
  if (!token)
    return token;
  // Created 0600 before a byte is written; O_EXCL: never follow a planted file.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return make_error(errc::io_error, path + ": cannot create the token file: " + std::strerror(errno));
  auto line = *token + "\n";
  bool ok = ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  ok = ::fsync(fd) == 0 && ok;
  ::close(fd);
  if (!ok)
    return make_error(errc::io_error, path + ": cannot write the token file");
  return token;
}

bool same_secret(std::string_view a, std::string_view b) {
  if (b.empty())
    return false;
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i % std::max<size_t>(1, b.size())]);
  return diff == 0;
}

} // namespace troupe::cluster
