#include "runtime/host.hpp"

#include <unistd.h>

namespace troupe::runtime {

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0')
    return "localhost";
  return buf;
}

} // namespace troupe::runtime
