#include "actors/inference/rollout_group.hpp"

#include "actors/fan_out.hpp"
#include "runtime/binary_form.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <deque>
#include <map>

namespace troupe::actors::inference {

namespace {

// The state of both kinds: a TP group's ranks, or a fleet's replicas.
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
  // A fleet's: the replica that generated a request id, for the requests
  // that extend it (the latest kept_ids_max ids, the oldest dropped first).
  std::map<std::string, size_t> replica_of;
  std::deque<std::string> kept_ids;
  /// A fleet's: the replica of each request generated ahead, until collected.
  std::map<std::string, size_t> ahead_replica;
  static inline const char* name = "rollout_group";
};

constexpr size_t kept_ids_max = 1 << 14;

using group_ptr = rollout_actor::stateful_pointer<group_state>;

// Every rank answers the same request; the group answers combine(answers).
template <class R, class Out = R, class Combine, class... Ts>
caf::typed_response_promise<Out> to_all(group_ptr self, Combine combine, const Ts&... xs) {
  auto ranks = self->state.ranks;
  return fan_out<R, Out>(
      self, ranks.size(), [=](size_t r) { return self->request(ranks[r], caf::infinite, xs...); },
      combine);
}

void end_group(group_ptr self, const caf::error& reason) {
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
void drive(group_ptr self) {
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

// Starts driving a TP group's ranks after a message that may add work.
void drive_after(group_ptr self) {
  if (self->state.driving)
    self->state.added = true;
  else
    drive(self);
}

// Ending the group ends its ranks; a rank that goes down ends the group.
void bind_to_ranks(group_ptr self) {
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

// Opens a call that end_group fails if the group ends first; answer(id)
// takes it back (empty when it was failed already).
std::pair<uint64_t, caf::typed_response_promise<generation>> open_call(group_ptr self) {
  auto id = self->state.next_call++;
  auto caller = self->make_response_promise<generation>();
  self->state.open.emplace(id, caller);
  return {id, caller};
}

void answer(group_ptr self, uint64_t id, expected<generation> g) {
  auto it = self->state.open.find(id);
  if (it == self->state.open.end())
    return; // failed already by end_group
  auto promise = it->second;
  self->state.open.erase(it);
  if (g)
    promise.deliver(std::move(*g));
  else
    promise.deliver(g.error());
}

// A TP group: every rank generates every request (NOTE [rollout group]).
caf::result<generation> tp_generate(group_ptr self, const std::vector<generate_request>& requests) {
  auto [id, caller] = open_call(self);
  auto ranks = self->state.ranks;
  gather_replies<generation>(
      ranks.size(),
      [=](size_t r) {
        return self->request(ranks[r], caf::infinite, generate_atom::value, requests);
      },
      [self, id = id](expected<std::vector<generation>> parts) {
        answer(self, id, parts ? same_tokens(*parts) : expected<generation>{parts.error()});
      });
  if (!requests.empty())
    drive_after(self);
  return caller;
}

// The replica of each request: the one that generated what it extends,
// else its slice's (NOTE [rollout fleet]).
std::vector<size_t> replicas_of(group_ptr self, const std::vector<generate_request>& requests) {
  const auto dp = self->state.ranks.size();
  std::vector<size_t> out(requests.size());
  for (size_t r = 0; r < dp; ++r) {
    auto [first, last] = fleet_slice(requests.size(), dp, r);
    std::fill(out.begin() + static_cast<long>(first), out.begin() + static_cast<long>(last), r);
  }
  for (size_t i = 0; i < requests.size(); ++i)
    if (!requests[i].extends.empty())
      if (auto it = self->state.replica_of.find(parse_sample_ref(requests[i].extends).first);
          it != self->state.replica_of.end())
        out[i] = it->second;
  return out;
}

void remember_replica(group_ptr self, const std::string& id, size_t replica) {
  auto& st = self->state;
  if (st.replica_of.insert_or_assign(id, replica).second)
    st.kept_ids.push_back(id);
  while (st.kept_ids.size() > kept_ids_max) {
    st.replica_of.erase(st.kept_ids.front());
    st.kept_ids.pop_front();
  }
}

// The replicas' answers in the caller's order (`where`: each request's
// replica), with the fleet's counters; an error when a replica answered
// another number of requests than it was asked.
expected<generation> in_callers_order(group_ptr self, std::vector<generation>& got,
                                      const std::vector<size_t>& where) {
  std::vector<size_t> asked(got.size(), 0);
  for (auto r : where)
    ++asked[r];
  for (size_t r = 0; r < got.size(); ++r)
    if (got[r].outputs.size() != asked[r])
      return make_error(errc::internal, "rollout fleet: replica " + std::to_string(r) +
                                            " answered " + std::to_string(got[r].outputs.size()) +
                                            " of " + std::to_string(asked[r]) + " requests");
  generation g;
  std::vector<size_t> next(got.size(), 0);
  for (auto r : where) {
    auto& out = got[r].outputs[next[r]++];
    remember_replica(self, out.id, r);
    g.outputs.push_back(std::move(out));
  }
  std::vector<engine_metrics> m;
  for (auto& part : got)
    m.push_back(part.engine);
  g.engine = combined_metrics(m);
  return g;
}

// A fleet: each replica generates its requests; the outputs go back in the
// caller's order (NOTE [rollout fleet]).
caf::result<generation> fleet_generate(group_ptr self, std::vector<generate_request> requests) {
  auto [id, caller] = open_call(self);
  auto ranks = self->state.ranks;
  auto where = replicas_of(self, requests);
  auto parts = std::make_shared<std::vector<std::vector<generate_request>>>(ranks.size());
  for (size_t i = 0; i < requests.size(); ++i)
    (*parts)[where[i]].push_back(std::move(requests[i]));
  gather_replies<generation>(
      ranks.size(),
      [=](size_t r) {
        return self->request(ranks[r], caf::infinite, generate_atom::value, (*parts)[r]);
      },
      [self, id = id, where](expected<std::vector<generation>> got) {
        answer(self, id,
               got ? in_callers_order(self, *got, where) : expected<generation>{got.error()});
      });
  return caller;
}

expected<int64_t> rank0(std::vector<int64_t>& xs) {
  return xs.front();
}

expected<int64_t> sum(std::vector<int64_t>& xs) {
  int64_t out = 0;
  for (auto x : xs)
    out += x;
  return out;
}

// NOTE [batches ahead]: a TP group queues them on every rank; a fleet
// splits them as generate calls, and every replica hears the call (with a
// pace, each runs its steps: NOTE [paced rollout]).
caf::result<int64_t> generate_ahead(group_ptr self, bool fleet,
                                    std::vector<generate_request> requests) {
  auto ranks = self->state.ranks;
  if (!fleet) {
    auto rp = to_all<int64_t>(self, rank0, generate_atom::value, ahead_atom::value, requests);
    drive_after(self);
    return rp;
  }
  auto where = replicas_of(self, requests);
  std::vector<std::vector<generate_request>> parts(ranks.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    self->state.ahead_replica[requests[i].id] = where[i];
    parts[where[i]].push_back(std::move(requests[i]));
  }
  return fan_out<int64_t, int64_t>(
      self, ranks.size(),
      [=](size_t r) {
        return self->request(ranks[r], caf::infinite, generate_atom::value, ahead_atom::value,
                             parts[r]);
      },
      sum);
}

// A TP group's collect: every rank's outputs, which must agree.
caf::result<generation> tp_collect(group_ptr self, const std::vector<std::string>& ids) {
  auto [id, caller] = open_call(self);
  auto ranks = self->state.ranks;
  gather_replies<generation>(
      ranks.size(),
      [=](size_t r) { return self->request(ranks[r], caf::infinite, collect_atom::value, ids); },
      [self, id = id](expected<std::vector<generation>> parts) {
        answer(self, id, parts ? same_tokens(*parts) : expected<generation>{parts.error()});
      });
  drive_after(self);
  return caller;
}

// A fleet's collect: each replica collects its requests (every replica is
// asked, so the answer's counters are the fleet's); the outputs go back in
// the caller's order.
caf::result<generation> fleet_collect(group_ptr self, const std::vector<std::string>& ids) {
  auto& st = self->state;
  std::vector<size_t> where;
  for (const auto& rid : ids) {
    auto it = st.ahead_replica.find(rid);
    if (it == st.ahead_replica.end())
      return make_error(errc::not_found, "rollout fleet collect: request '" + rid +
                                             "' was not generated ahead, or was collected already");
    where.push_back(it->second);
  }
  auto ranks = st.ranks;
  std::vector<std::vector<std::string>> parts(ranks.size());
  for (size_t i = 0; i < ids.size(); ++i)
    parts[where[i]].push_back(ids[i]);
  auto [id, caller] = open_call(self);
  gather_replies<generation>(
      ranks.size(),
      [=](size_t r) {
        return self->request(ranks[r], caf::infinite, collect_atom::value, parts[r]);
      },
      [self, id = id, where, ids](expected<std::vector<generation>> got) {
        for (const auto& rid : ids)
          self->state.ahead_replica.erase(rid);
        answer(self, id,
               got ? in_callers_order(self, *got, where) : expected<generation>{got.error()});
      });
  return caller;
}

// A group's snapshot: its members', one after the other (NOTE [engine
// snapshot] of each).
expected<std::string> pack(std::vector<std::string>& parts) {
  return runtime::to_bytes(parts, "rollout group snapshot");
}

// Puts each member's snapshot back; a fleet learns where each request is.
caf::result<std::vector<std::string>> restore_members(group_ptr self, bool fleet,
                                                      const std::string& bytes) {
  std::vector<std::string> parts;
  if (auto ok = runtime::from_bytes(bytes, parts, "rollout group restore: the snapshot"); !ok)
    return ok.error();
  auto ranks = self->state.ranks;
  if (parts.size() != ranks.size())
    return make_error(errc::invalid_config,
                      std::string{"rollout group restore: the snapshot holds "} +
                          std::to_string(parts.size()) + (fleet ? " replicas" : " ranks") +
                          ", this rollout has " + std::to_string(ranks.size()));
  using ids = std::vector<std::string>;
  auto rp = fan_out<ids, ids>(
      self, ranks.size(),
      [=](size_t r) {
        return self->request(ranks[r], caf::infinite, restore_atom::value, parts[r]);
      },
      [self, fleet](std::vector<ids>& got) -> expected<ids> {
        if (!fleet)
          return got.front();
        ids all;
        for (size_t r = 0; r < got.size(); ++r)
          for (auto& rid : got[r]) {
            self->state.ahead_replica[rid] = r;
            all.push_back(std::move(rid));
          }
        return all;
      });
  if (!fleet)
    drive_after(self);
  return rp;
}

// Each member receives the whole version: a member's temporary bytes.
expected<sync_bytes> same_bytes(std::vector<sync_bytes>& got) {
  auto out = got.front();
  for (const auto& b : got) {
    if (b.bytes != out.bytes)
      return make_error(errc::corrupted,
                        "rollout group: the members received different byte counts");
    out.temporary = std::max(out.temporary, b.temporary);
  }
  return out;
}

// A TP group (fleet false) or a fleet of replicas.
rollout_actor::behavior_type members_behavior(group_ptr self, std::vector<rollout_actor> ranks,
                                              bool fleet) {
  self->state.ranks = std::move(ranks);
  bind_to_ranks(self);
  const char* kind = fleet ? "rollout fleet (dp)" : "tensor-parallel rollout";
  return {
      [=](generate_atom, std::vector<generate_request>& requests) -> caf::result<generation> {
        return fleet ? fleet_generate(self, std::move(requests)) : tp_generate(self, requests);
      },
      [=](generate_atom, ahead_atom, std::vector<generate_request>& requests) {
        return generate_ahead(self, fleet, std::move(requests));
      },
      [=](collect_atom, const std::vector<std::string>& ids) -> caf::result<generation> {
        return fleet ? fleet_collect(self, ids) : tp_collect(self, ids);
      },
      [=](snapshot_atom) -> caf::result<std::string> {
        return to_all<std::string>(self, pack, snapshot_atom::value);
      },
      [=](restore_atom, const std::string& bytes) { return restore_members(self, fleet, bytes); },
      [=](load_weights_atom, int64_t version, const shared_weights& w) -> caf::result<int64_t> {
        return to_all<int64_t>(self, rank0, load_weights_atom::value, version, w);
      },
      [=](receive_weights_atom, int64_t version,
          const weight_channel& c) -> caf::result<sync_bytes> {
        if (runtime::traits_of(c.kind).one_receiver)
          return make_error(errc::unsupported,
                            std::string{kind} + ": weight_sync.transport " +
                                std::string{to_string(c.kind)} +
                                " reaches one receiver; every rank receives the weights (use "
                                "alias, shm or disk)");
        return to_all<sync_bytes>(self, same_bytes, receive_weights_atom::value, version, c);
      },
      [=](inject_kill_atom, bool whole) {
        self->send(self->state.ranks.front(), inject_kill_atom::value, whole);
      },
      [=](metrics_atom) -> caf::result<engine_metrics> {
        auto ranks = self->state.ranks;
        auto n = fleet ? ranks.size() : 1; // a TP group's ranks count the same work
        return fan_out<engine_metrics, engine_metrics>(
            self, n,
            [=](size_t r) { return self->request(ranks[r], caf::infinite, metrics_atom::value); },
            [](std::vector<engine_metrics>& m) -> expected<engine_metrics> {
              return combined_metrics(m);
            });
      },
      [=](clear_cache_atom) -> caf::result<int64_t> {
        return fleet ? to_all<int64_t>(self, sum, clear_cache_atom::value)
                     : to_all<int64_t>(self, rank0, clear_cache_atom::value);
      },
      [=](release_atom) -> caf::result<int64_t> {
        return to_all<int64_t>(self, sum, release_atom::value);
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
  return sys.spawn(members_behavior, std::move(ranks), false);
}

std::pair<size_t, size_t> fleet_slice(size_t n, size_t dp, size_t r) {
  const auto base = n / dp, extra = n % dp;
  const auto first = r * base + std::min(r, extra);
  return {first, first + base + (r < extra ? 1 : 0)};
}

expected<rollout_actor> spawn_rollout_fleet(caf::actor_system& sys,
                                            std::vector<rollout_actor> replicas) {
  if (replicas.empty())
    return make_error(errc::invalid_argument, "a rollout fleet needs at least one replica");
  return sys.spawn(members_behavior, std::move(replicas), true);
}

engine_metrics combined_metrics(const std::vector<engine_metrics>& parts) {
  engine_metrics out;
  if (parts.empty())
    return out;
  if (parts.size() == 1)
    return parts.front();
  double hit = 0;
  for (const auto& p : parts) {
    out.steps += p.steps;
    out.prompt_tokens += p.prompt_tokens;
    out.prefill_tokens_computed += p.prefill_tokens_computed;
    out.generated_tokens += p.generated_tokens;
    out.recomputed_tokens += p.recomputed_tokens;
    out.preemptions += p.preemptions;
    out.finished_requests += p.finished_requests;
    out.busy_seconds = std::max(out.busy_seconds, p.busy_seconds); // side by side
    out.ttft_ms_sum += p.ttft_ms_sum;
    out.itl_ms_sum += p.itl_ms_sum;
    out.itl_count += p.itl_count;
    hit += p.prefix_hit_rate;
    out.kv_utilization += p.kv_utilization * static_cast<double>(p.num_blocks);
    out.kv_peak_utilization = std::max(out.kv_peak_utilization, p.kv_peak_utilization);
    out.running += p.running;
    out.waiting += p.waiting;
    out.num_blocks += p.num_blocks;
    out.fused_decode_steps += p.fused_decode_steps;
    out.aten_decode_steps += p.aten_decode_steps;
    if (!p.aten_decode_reason.empty())
      out.aten_decode_reason = p.aten_decode_reason;
  }
  out.prefix_hit_rate = hit / static_cast<double>(parts.size());
  if (out.num_blocks > 0)
    out.kv_utilization /= static_cast<double>(out.num_blocks);
  return out;
}

} // namespace troupe::actors::inference
