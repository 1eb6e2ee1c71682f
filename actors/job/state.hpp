#pragma once
// The job's state machine.
//
// NOTE [job states]:
//
//   pending ──start──► preparing ──prepared──► running ◄──resume── paused
//      │                   │                  │  │ └──(pause, at the next ─►┘
//      │                   │                  │  │     phase boundary)
//      │ cancel            │ driver ends      │  └─ driver ends ─► succeeded | failed | cancelled
//      ▼                   ▼                  ▼
//   cancelled     failed | cancelled     (paused: cancel ends it too)
//
// `running` carries the stage, iteration and phase (job_status). A command
// that the current state does not allow is refused with errc::illegal_state
// and a sentence saying why (resume a running job, pause a finished one);
// the final states (succeeded, failed, cancelled) refuse every command but
// status, subscribe and await. Pause, checkpoint, cancel and setting
// updates are served by the driver between phases (NOTE [job boundaries] in
// job_actor.hpp).

#include "runtime/enum_names.hpp"

#include "actors/job/events.hpp"

#include <string>

namespace troupe::actors::job {

enum class command : uint8_t { start, pause, resume, cancel, checkpoint, update };
TROUPE_ENUM_NAMES(command, "start", "pause", "resume", "cancel", "checkpoint", "update")

class job_fsm {
public:
  job_state state() const noexcept { return state_; }

  /// Whether `c` is allowed now; illegal_state naming the state otherwise.
  expected<void> check(command c) const;

  /// Moves to `to` if that is an edge of the diagram; illegal_state
  /// otherwise (a bug in the caller: transitions come from the job actor).
  expected<void> move(job_state to);

private:
  job_state state_ = job_state::pending;
};

} // namespace troupe::actors::job
