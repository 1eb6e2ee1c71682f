#pragma once
// NOTE [busy on replies]: the reply to a request an RL step makes of a role
// carries the seconds the role spent serving it (a DP group: its slowest
// rank, the ranks compute side by side). The driver sums them over a step
// for perf/orchestration_share without asking the roles anything more; the
// rollout's replies carry its engine counters instead (inference::generation).

#include "runtime/wire_float.hpp"

#include <caf/meta/type_name.hpp>

namespace troupe::actors::train {

template <class T>
struct served {
  T value{};
  double busy_s = 0;
};

template <class Inspector, class T>
typename Inspector::result_type inspect(Inspector& f, served<T>& x) {
  return f(caf::meta::type_name("served"), x.value, runtime::wire(x.busy_s));
}

} // namespace troupe::actors::train
