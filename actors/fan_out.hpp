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
  /// A rank's errc::unavailable, held back (NOTE [the cause first]).
  caf::error held;
};

/// Sends one request per rank (send(r) → the response handle) and calls
/// done(the replies in rank order) once all arrived, or done(the first
/// error) — once.
/// NOTE [the cause first]: a rank whose collective failed because a peer's
/// connection closed answers errc::unavailable, a consequence; the peer
/// that went away answers errc::lost (its proxy), the cause, which the
/// caller must see to recover (NOTE [supervision] in actors/rl/
/// supervision.hpp). So an unavailable answer is held until every rank
/// has answered, and a lost one among them comes first.
template <class R, class Send, class Done>
void gather_replies(size_t n, Send send, Done done) {
  auto g = std::make_shared<gathering<R>>();
  g->parts.resize(n);
  g->left = n;
  auto settle = [g, done]() mutable {
    if (--g->left > 0)
      return;
    g->done = true;
    if (g->held)
      done(expected<std::vector<R>>{std::move(g->held)});
    else
      done(expected<std::vector<R>>{std::move(g->parts)});
  };
  for (size_t r = 0; r < n; ++r)
    send(r).then(
        [=](R& x) mutable {
          if (g->done)
            return;
          g->parts[r] = std::move(x);
          settle();
        },
        [=](caf::error& e) mutable {
          if (g->done)
            return;
          if (code_of(e) == errc::unavailable) {
            if (!g->held)
              g->held = std::move(e);
            settle();
            return;
          }
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
