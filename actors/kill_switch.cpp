#include "actors/kill_switch.hpp"

#include <caf/all.hpp>

#include <csignal>
#include <cstdio>

namespace troupe::actors {

bool kill_switch::fire(caf::scheduled_actor* self) {
  if (!armed_)
    return false;
  armed_ = false;
  if (whole_process_) {
    std::fflush(stdout);
    std::fflush(stderr);
    ::raise(SIGKILL);
  }
  self->quit(caf::exit_reason::kill);
  return true;
}

} // namespace troupe::actors
