#pragma once
// What the client commands and the daemons share: where the controller is
// and how to reach it (apps/control.hpp's client_flags), and error output.

#include "apps/control.hpp"
#include "cluster/api_client.hpp"
#include "cluster/controller_config.hpp"
#include "cluster/credentials.hpp"
#include "runtime/error.hpp"

#include <initializer_list>
#include <string>

namespace troupe::apps {

/// The environment variable `name`, or "".
std::string env(const char* name);
/// The first non-empty string.
std::string first_of(std::initializer_list<std::string> xs);
/// $XDG_STATE_HOME/troupe, else ~/.local/state/troupe.
std::string default_state_dir();
/// "troupe CMD: <error>" and its violations, one per line, on stderr.
void print_error(const char* cmd, const caf::error& err);

/// Where the controller is and how to reach it (no credentials): flags,
/// environment, the client file, then a controller on this machine.
struct client_place {
  cluster::client_file file;
  std::string state_dir;
  cluster::client_options options;
};

expected<client_place> place_of(const client_flags& c);

} // namespace troupe::apps
