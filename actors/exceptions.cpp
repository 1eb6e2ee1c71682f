#include "actors/exceptions.hpp"

namespace troupe::actors {

std::string what_of(const std::exception_ptr& ep) {
  try {
    std::rethrow_exception(ep);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

caf::error error_of_exception(const std::exception_ptr& ep, std::string_view who) {
  auto what = what_of(ep);
  return make_error(errc::internal, who.empty() ? what : std::string{who} + ": " + what);
}

} // namespace troupe::actors
