#pragma once
// What an exception that escapes an actor's handler turns into: an error
// that names who threw and says what, instead of CAF's bare
// `runtime_error` (NOTE [escaping exceptions]).

#include "runtime/error.hpp"

#include <exception>
#include <string>
#include <string_view>

namespace troupe::actors {

/// The exception's what(), or "unknown exception" for one that is not a
/// std::exception.
std::string what_of(const std::exception_ptr& ep);

/// NOTE [escaping exceptions]: an actor's exception handler. CAF ends the
/// actor with the error returned, and answers the request being served (if
/// any) with it, so the caller's error reads "<who>: <what>" (a role
/// passes "": the driver's request already names the role). Callers that
/// hold state the end must not lose (the job actor: its journal and
/// awaiters) do their own handling first and then return this.
caf::error error_of_exception(const std::exception_ptr& ep, std::string_view who);

} // namespace troupe::actors
