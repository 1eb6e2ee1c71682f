#include "actors/kill_switch.hpp"

#include <caf/all.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <thread>

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

std::function<void()> kill_switch::hanging_hook() {
  return [] {
    std::fprintf(stderr, "hanging inside a collective (debug.kills how: hang)\n");
    std::fflush(stderr);
    while (true)
      std::this_thread::sleep_for(std::chrono::hours(1));
  };
}

bool kill_switch::fired_inside(caf::scheduled_actor* self) {
  if (!*died_inside_)
    return false;
  self->quit(caf::exit_reason::kill);
  return true;
}

} // namespace troupe::actors
