#pragma once
// A process group that misbehaves on purpose (test support only): it wraps
// one rank's real backend and, from a chosen operation on, makes that rank
// fail the way a lost or slow process does, while its peers keep their real
// gloo ranks. An "operation" is one call into the backend: a native
// collective, or one started send or receive (a ring collective is several).
//
//   never_arrive  the rank stops taking part: its calls fail at once and
//                 nothing reaches the wire, so its peers wait until their
//                 timeout (a process that hangs or never started).
//   late          the operation starts `late_ms` late, then runs (a slow
//                 rank: with late_ms past the timeout, the peers time out).
//   abort         the rank's gloo context is destroyed, closing its
//                 connections mid-collective (a process that dies); this
//                 and every later call fail with errc::cancelled.

#include "runtime/hooked_backend.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace troupe::test {

struct fault_plan {
  enum class kind { never_arrive, late, abort };
  kind what = kind::never_arrive;
  /// The first operation (0-based) that the fault hits.
  int at_operation = 0;
  /// late: how long the operation waits before it starts.
  int late_ms = 0;
};

class faulty_backend final : public runtime::hooked_backend {
public:
  faulty_backend(std::unique_ptr<runtime::collective_backend> inner, fault_plan plan)
      : hooked_backend(std::move(inner)), plan_(plan) {}

private:
  expected<void> before(int index, const char* op) override {
    std::string where = std::string{"injected fault at operation "} + std::to_string(index) + " (" +
                        op + ", rank " + std::to_string(rank()) + ")";
    if (!inner_)
      return make_error(errc::cancelled, where + ": the group was aborted");
    if (index < plan_.at_operation)
      return {};
    switch (plan_.what) {
    case fault_plan::kind::never_arrive:
      return make_error(errc::unavailable, where + ": this rank never arrives");
    case fault_plan::kind::abort:
      inner_.reset(); // closes the rank's gloo pairs: peers see the connections drop
      return make_error(errc::cancelled, where + ": aborted");
    case fault_plan::kind::late:
      if (index == plan_.at_operation)
        std::this_thread::sleep_for(std::chrono::milliseconds(plan_.late_ms));
      break;
    }
    return {};
  }

  fault_plan plan_;
};

/// `group` with `plan` injected into its rank (the group is consumed).
inline runtime::process_group with_faults(runtime::process_group group, fault_plan plan) {
  return runtime::process_group{
      std::make_unique<faulty_backend>(std::move(group).release_backend(), plan)};
}

} // namespace troupe::test
