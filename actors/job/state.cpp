#include "actors/job/state.hpp"

namespace troupe::actors::job {

expected<void> job_fsm::check(command c) const {
  using s = job_state;
  auto refuse = [&](const std::string& why) -> expected<void> {
    return make_error(errc::illegal_state,
                      std::string{"cannot "} + std::string{to_string(c)} + ": " + why);
  };
  if (is_final(state_))
    return refuse("the job has finished (" + std::string{to_string(state_)} + ")");
  switch (c) {
  case command::start:
    if (state_ != s::pending)
      return refuse("the job has already started (" + std::string{to_string(state_)} + ")");
    return {};
  case command::pause:
    if (state_ == s::paused)
      return refuse("the job is already paused");
    if (state_ == s::pending)
      return refuse("the job has not started");
    return {};
  case command::resume:
    if (state_ != s::paused)
      return refuse("the job is " + std::string{to_string(state_)} + ", not paused");
    return {};
  case command::cancel:
    return {};
  case command::checkpoint:
  case command::update:
    if (state_ == s::pending)
      return refuse("the job has not started");
    return {};
  }
  return refuse("unknown command");
}

expected<void> job_fsm::move(job_state to) {
  using s = job_state;
  bool ok = false;
  switch (state_) {
  case s::pending:
    ok = to == s::preparing || to == s::cancelled;
    break;
  case s::preparing:
    ok = to == s::running || to == s::failed || to == s::cancelled;
    break;
  case s::running:
    ok = to == s::paused || is_final(to);
    break;
  case s::paused:
    ok = to == s::running || is_final(to);
    break;
  default:
    ok = false;
  }
  if (!ok)
    return make_error(errc::illegal_state, "job state " + std::string{to_string(state_)} + " → " +
                                               std::string{to_string(to)} + " is not a transition");
  state_ = to;
  return {};
}

} // namespace troupe::actors::job
