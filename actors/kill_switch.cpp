#include "actors/kill_switch.hpp"

#include <caf/all.hpp>

#include <csignal>
#include <cstdio>
#include <stdexcept>

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

std::function<void()> kill_switch::dying_hook(bool whole_process) {
  return [whole_process, died = died_inside_] {
    if (whole_process) {
      std::fflush(stdout);
      std::fflush(stderr);
      ::raise(SIGKILL);
    }
    *died = true;
    throw std::runtime_error("killed inside a collective (debug.kills)");
  };
}

bool kill_switch::fired_inside(caf::scheduled_actor* self) {
  if (!*died_inside_)
    return false;
  self->quit(caf::exit_reason::kill);
  return true;
}

} // namespace troupe::actors
