#pragma once
// A generate call to a rollout actor (one rank or a group) from a test,
// waiting for the answer or `timeout`.
#include "actors/inference/rollout.hpp"
#include "runtime/error.hpp"

#include <caf/all.hpp>

#include <chrono>
#include <vector>

namespace troupe::actors::inference::testing {

inline expected<std::vector<request_output>>
generate_on(caf::actor_system& sys, const rollout_actor& r, std::vector<generate_request> reqs,
            std::chrono::seconds timeout = std::chrono::seconds(60)) {
  caf::scoped_actor self{sys};
  expected<std::vector<request_output>> out = make_error(errc::timeout, "no answer");
  self->request(r, timeout, generate_atom::value, std::move(reqs))
      .receive([&](generation& g) { out = std::move(g.outputs); },
               [&](caf::error& e) { out = std::move(e); });
  return out;
}

/// Any request to a rollout actor: its answer, or the error.
template <class R, class... Ts>
expected<R> ask_rollout(caf::actor_system& sys, const rollout_actor& r, Ts... xs) {
  caf::scoped_actor self{sys};
  expected<R> out = make_error(errc::timeout, "no answer");
  self->request(r, std::chrono::seconds(60), xs...)
      .receive([&](R& x) { out = std::move(x); }, [&](caf::error& e) { out = std::move(e); });
  return out;
}

} // namespace troupe::actors::inference::testing
