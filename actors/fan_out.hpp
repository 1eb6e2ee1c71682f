#pragma once
// One request to each of a group actor's ranks, one answer to the caller:
// the engine group (actors/train) and the rollout group (actors/inference)
// both answer so.

#include "runtime/error.hpp"

#include <caf/typed_response_promise.hpp>

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

namespace troupe::actors {

template <class R>
struct gathering {
  std::vector<R> parts;
  size_t left = 0;
  bool done = false;
};

/// Sends one request per rank (send(r) → the response handle) and calls
/// done(the replies in rank order) once all arrived, or done(the first
/// error) — once.
template <class R, class Send, class Done>
void gather_replies(size_t n, Send send, Done done) {
  auto g = std::make_shared<gathering<R>>();
  g->parts.resize(n);
  g->left = n;
  for (size_t r = 0; r < n; ++r)
    send(r).then(
        [=](R& x) mutable {
          if (g->done)
            return;
          g->parts[r] = std::move(x);
          if (--g->left > 0)
            return;
          g->done = true;
          done(expected<std::vector<R>>{std::move(g->parts)});
        },
        [=](caf::error& e) mutable {
          if (g->done)
            return;
          g->done = true;
          done(expected<std::vector<R>>{std::move(e)});
        });
}

/// Answers the current request with combine(the replies in rank order) —
/// an expected<Out> — or the first error.
template <class R, class Out, class Self, class Send, class Combine>
caf::typed_response_promise<Out> fan_out(Self self, size_t n, Send send, Combine combine) {
  auto rp = self->template make_response_promise<Out>();
  gather_replies<R>(n, send, [rp, combine](expected<std::vector<R>> parts) mutable {
    if (!parts) {
      rp.deliver(parts.error());
      return;
    }
    expected<Out> c = combine(*parts);
    if (c)
      rp.deliver(std::move(*c));
    else
      rp.deliver(c.error());
  });
  return rp;
}

} // namespace troupe::actors
