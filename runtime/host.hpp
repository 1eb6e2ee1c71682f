#pragma once
// Facts about the machine this process runs on.

#include <string>

namespace troupe::runtime {

/// The host's name (gethostname), "localhost" when it has none.
std::string host_name();

} // namespace troupe::runtime
