// Fuzz target: the dashboard's HTTP routes (cluster/dashboard.hpp) — what a
// browser, or anything else that reaches the port, sends: request line,
// headers, cookies and bodies. Each input is one request over a real TCP
// connection to a real dashboard (fuzz/control_plane.hpp): the first byte
// picks what the harness adds after the request line (mod 3: nothing, the
// logged-in session's cookie, the cookie and its CSRF header); the rest is
// the request as sent. Whatever comes back is an HTTP response; without a
// session the JSON API and the commands never answer 2xx; the server
// answers the next connection.
#include "tests/fuzz/control_plane.hpp"
#include "tests/fuzz/fuzz_input.hpp"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

using namespace troupe;

namespace {

/// Whether `got` holds a whole response: its head, and the body its
/// Content-Length gives (a response without one ends when the server
/// closes the connection, or on the timeout).
bool complete(const std::string& got) {
  const auto head_end = got.find("\r\n\r\n");
  if (head_end == std::string::npos)
    return false;
  auto head = got.substr(0, head_end);
  for (auto& c : head)
    c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto at = head.find("\r\ncontent-length:");
  if (at == std::string::npos)
    return false;
  const auto length = std::strtoull(head.c_str() + at + 18, nullptr, 10);
  return got.size() - head_end - 4 >= length;
}

/// Sends `request` on a fresh connection and reads the answer until it is
/// whole, the server closes the connection, or 300 ms pass without a byte.
/// (The sending side stays open: the server takes a half-closed connection
/// for a client gone and does not answer. So an incomplete request, most of
/// what the fuzzer sends, costs the whole wait: it bounds the rate.)
std::string exchange(const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    fuzz::broken();
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(fuzz::control_plane::get().web->port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{0, 300000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    std::fprintf(stderr, "dashboard_fuzz: the dashboard no longer accepts connections\n");
    fuzz::broken();
  }
  for (size_t sent = 0; sent < request.size();) {
    const auto n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n <= 0)
      break;
    sent += static_cast<size_t>(n);
  }
  std::string got;
  char buf[4096];
  while (got.size() < (1 << 20) && !complete(got)) {
    const auto n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0)
      break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return got;
}

int status_of(const std::string& response) {
  if (response.rfind("HTTP/1.", 0) != 0 || response.size() < 12)
    return 0;
  return std::atoi(response.c_str() + 9);
}

/// Logs in once with the token (a form POST), as a browser does.
void log_in(fuzz::control_plane& cp) {
  if (!cp.session.empty())
    return;
  const auto body = "token=" + cp.token;
  const auto r = exchange("POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                          "application/x-www-form-urlencoded\r\nContent-Length: " +
                          std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
  const auto at = r.find("troupe_session=");
  if (at == std::string::npos) {
    std::fprintf(stderr, "dashboard_fuzz: logging in failed:\n%s\n", r.c_str());
    fuzz::broken();
  }
  cp.session = r.substr(at + 15, r.find(';', at) - at - 15);
  const auto s = exchange(
      "GET /api/session HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: troupe_session=" + cp.session +
      "\r\nConnection: close\r\n\r\n");
  const auto body_at = s.find("\r\n\r\n");
  auto j = nlohmann::json::parse(s.substr(body_at == std::string::npos ? s.size() : body_at + 4),
                                 nullptr, false);
  if (!j.is_object() || !j.contains("csrf"))
    fuzz::broken();
  cp.csrf = j["csrf"].get<std::string>();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0)
    return 0;
  auto& cp = fuzz::control_plane::get();
  log_in(cp);
  const int added = data[0] % 3;
  std::string request{fuzz::text_of(data + 1, size - 1)};
  if (added > 0) {
    std::string headers = "Cookie: troupe_session=" + cp.session + "\r\n";
    if (added == 2)
      headers += "X-CSRF-Token: " + cp.csrf + "\r\n";
    const auto eol = request.find("\r\n");
    request.insert(eol == std::string::npos ? request.size() : eol + 2, headers);
  }
  const auto response = exchange(request);
  const int status = status_of(response);
  if (!response.empty() && status == 0)
    fuzz::broken();
  const auto path_at = request.find(' ');
  const bool api = path_at != std::string::npos && (request.compare(path_at + 1, 5, "/api/") == 0);
  if (added == 0 && api && status >= 200 && status < 300)
    fuzz::broken();
  return 0;
}
