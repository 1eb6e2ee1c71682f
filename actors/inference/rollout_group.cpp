#include "actors/inference/rollout_group.hpp"

#include "actors/fan_out.hpp"

#include <caf/all.hpp>

#include <map>

namespace troupe::actors::inference {

namespace {

struct group_state {
  std::vector<rollout_actor> ranks;
  bool driving = false;
  // Requests forwarded since the current drive round went out: the ranks
  // may answer "no work" from before them, and must be driven again.
  bool added = false;
  // The callers' open generate calls, failed with the reason when the
  // group ends before answering them.
  std::map<uint64_t, caf::typed_response_promise<generation>> open;
  uint64_t next_call = 0;
  static inline const char* name = "rollout_group";
};

using self_ptr = rollout_actor::stateful_pointer<group_state>;

// Every rank answers the same request; the group answers combine(answers).
template <class R, class Out = R, class Combine, class... Ts>
caf::typed_response_promise<Out> to_all(self_ptr self, Combine combine, const Ts&... xs) {
  auto ranks = self->state.ranks;
  return fan_out<R, Out>(
      self, ranks.size(), [=](size_t r) { return self->request(ranks[r], caf::infinite, xs...); },
      combine);
}

void end_group(self_ptr self, const caf::error& reason) {
  for (auto& [id, p] : self->state.open)
    p.deliver(reason);
  self->state.open.clear();
  self->quit(reason);
}

// Rank 0's outputs when every rank generated the same tokens.
expected<generation> same_tokens(std::vector<generation>& parts) {
  const auto& first = parts.front().outputs;
  for (size_t r = 1; r < parts.size(); ++r) {
    const auto& other = parts[r].outputs;
    for (size_t i = 0; i < first.size(); ++i) {
      bool same = i < other.size() && other[i].samples.size() == first[i].samples.size();
      for (size_t s = 0; same && s < first[i].samples.size(); ++s)
        same = other[i].samples[s].tokens == first[i].samples[s].tokens;
      if (!same || other.size() != first.size())
        return make_error(errc::internal, "tensor-parallel rollout: rank " + std::to_string(r) +
                                              " generated other tokens than rank 0 for request '" +
                                              first[i].id + "'");
    }
  }
  return std::move(parts.front());
}

// Steps every rank once, and again while they have work (NOTE [rollout
// group]).
void drive(self_ptr self) {
  self->state.driving = true;
  self->state.added = false;
  auto ranks = self->state.ranks;
  gather_replies<bool>(
      ranks.size(),
      [=](size_t r) { return self->request(ranks[r], caf::infinite, drive_atom::value); },
      [=](expected<std::vector<bool>> more) {
        if (!more)
          return end_group(self, with_prefix(more.error(), "tensor-parallel rollout step"));
        for (size_t r = 1; r < more->size(); ++r)
          if ((*more)[r] != more->front())
            return end_group(self, make_error(errc::internal,
                                              "tensor-parallel rollout: rank " + std::to_string(r) +
                                                  " and rank 0 disagree on whether work remains"));
        if (more->front() || self->state.added)
          drive(self);
        else
          self->state.driving = false;
      });
}

// Ending the group ends its ranks; a rank that goes down ends the group.
void bind_to_ranks(self_ptr self) {
  auto ranks = self->state.ranks;
  self->attach_functor([ranks](const caf::error&) {
    for (const auto& r : ranks)
      caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  });
  for (const auto& r : ranks)
    self->monitor(r);
  self->set_down_handler([self](caf::down_msg& dm) {
    for (size_t r = 0; r < self->state.ranks.size(); ++r)
      if (self->state.ranks[r].address() == dm.source)
        end_group(self, dm.reason ? dm.reason
                                  : make_error(errc::unavailable,
                                               "rollout rank " + std::to_string(r) + " ended"));
  });
}

expected<int64_t> rank0(std::vector<int64_t>& xs) {
  return xs.front();
}

rollout_actor::behavior_type group_behavior(self_ptr self, std::vector<rollout_actor> ranks) {
  self->state.ranks = std::move(ranks);
  bind_to_ranks(self);
  return {
      [=](generate_atom, const std::vector<generate_request>& requests) -> caf::result<generation> {
        auto id = self->state.next_call++;
        auto caller = self->make_response_promise<generation>();
        self->state.open.emplace(id, caller);
        auto ranks = self->state.ranks;
        gather_replies<generation>(
            ranks.size(),
            [=](size_t r) {
              return self->request(ranks[r], caf::infinite, generate_atom::value, requests);
            },
            [=](expected<std::vector<generation>> parts) {
              auto it = self->state.open.find(id);
              if (it == self->state.open.end())
                return; // failed already by end_group
              auto promise = it->second;
              self->state.open.erase(it);
              auto g = parts ? same_tokens(*parts) : expected<generation>{parts.error()};
              if (g)
                promise.deliver(std::move(*g));
              else
                promise.deliver(g.error());
            });
        if (requests.empty())
          return caller;
        if (self->state.driving)
          self->state.added = true;
        else
          drive(self);
        return caller;
      },
      [=](load_weights_atom, int64_t version, const shared_weights& w) -> caf::result<int64_t> {
        return to_all<int64_t>(self, rank0, load_weights_atom::value, version, w);
      },
      [=](receive_weights_atom, int64_t version,
          const weight_channel& c) -> caf::result<sync_bytes> {
        if (runtime::traits_of(c.kind).one_receiver)
          return make_error(errc::unsupported,
                            "tensor-parallel rollout: weight_sync.transport " +
                                std::string{to_string(c.kind)} +
                                " reaches one receiver; the group's ranks each receive the "
                                "weights (use alias, shm or disk)");
        // Each rank receives the whole version: a rank's temporary bytes.
        return to_all<sync_bytes>(
            self,
            [](std::vector<sync_bytes>& got) -> expected<sync_bytes> {
              auto out = got.front();
              for (const auto& b : got) {
                if (b.bytes != out.bytes)
                  return make_error(errc::corrupted, "tensor-parallel rollout: the ranks "
                                                     "received different byte counts");
                out.temporary = std::max(out.temporary, b.temporary);
              }
              return out;
            },
            receive_weights_atom::value, version, c);
      },
      [=](metrics_atom) -> caf::result<engine_metrics> {
        auto ranks = self->state.ranks;
        return fan_out<engine_metrics, engine_metrics>(
            self, 1,
            [=](size_t) {
              return self->request(ranks.front(), caf::infinite, metrics_atom::value);
            },
            [](std::vector<engine_metrics>& m) -> expected<engine_metrics> { return m.front(); });
      },
      [=](clear_cache_atom) -> caf::result<int64_t> {
        return to_all<int64_t>(self, rank0, clear_cache_atom::value);
      },
      [=](release_atom) -> caf::result<int64_t> {
        return to_all<int64_t>(
            self,
            [](std::vector<int64_t>& bytes) -> expected<int64_t> {
              int64_t sum = 0;
              for (auto b : bytes)
                sum += b;
              return sum;
            },
            release_atom::value);
      },
      [=](drive_atom) -> caf::result<bool> { return self->state.driving; },
      [=](step_atom) {},
  };
}

} // namespace

expected<rollout_actor> spawn_rollout_group(caf::actor_system& sys,
                                            std::vector<rollout_actor> ranks) {
  if (ranks.empty())
    return make_error(errc::invalid_argument, "a rollout group needs at least one rank");
  return sys.spawn(group_behavior, std::move(ranks));
}

} // namespace troupe::actors::inference
