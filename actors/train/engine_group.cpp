#include "actors/train/engine_group.hpp"

#include "actors/fan_out.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <optional>

namespace troupe::actors::train {

namespace {

using runtime::tensor_batch;

struct group_state {
  std::vector<engine_actor> ranks;
  std::string role;
  dp_strategy strategy = dp_strategy::ddp;
  int tp = 1, pp = 1; // NOTE [tensor-parallel dispatch]
  static inline const char* name = "engine_group";

  // The ranks of one replica (its TP and PP ranks).
  int width() const { return tp * pp; }
  // The data-parallel replicas.
  size_t replicas() const { return ranks.size() / static_cast<size_t>(width()); }
  // Whether rank 0's whole-weight answers need every rank alongside.
  bool gathers_together() const { return strategy == dp_strategy::zero3 || width() > 1; }
};

using group_ptr = engine_actor::stateful_pointer<group_state>;

// Training metrics come back already reduced over the group
// (train_engine's group_metrics): every rank answers the same values.
expected<metric_map> group_metrics(const std::vector<metric_map>& parts) {
  return parts.front();
}

expected<tensor_batch> concat_rows(const std::vector<tensor_batch>& parts) {
  return tensor_batch::concat(parts);
}

expected<int64_t> sum_bytes(const std::vector<int64_t>& xs) {
  int64_t total = 0;
  for (auto x : xs)
    total += x;
  return total;
}

// NOTE [busy on replies]: the ranks compute side by side, so the group's
// reply carries `combine` of the ranks' values and its slowest rank's seconds.
template <class Combine>
auto slowest(Combine combine) {
  return [combine](const auto& parts) {
    using T = std::decay_t<decltype(parts[0].value)>;
    std::vector<T> values;
    values.reserve(parts.size());
    double busy = 0;
    for (const auto& p : parts) {
      values.push_back(p.value);
      busy = std::max(busy, p.busy_s);
    }
    expected<T> v = combine(values);
    if (!v)
      return expected<served<T>>{v.error()};
    return expected<served<T>>{served<T>{std::move(*v), busy}};
  };
}

// The rows of `b` divided over at most `n` ranks (fewer when b is smaller).
expected<std::vector<tensor_batch>> split_rows(const tensor_batch& b, size_t n) {
  auto parts = static_cast<int64_t>(std::min<size_t>(n, static_cast<size_t>(std::max<int64_t>(b.size(), 1))));
  return b.split(parts);
}

// Rank r's share of every minibatch of the update, in order.
expected<std::vector<tensor_batch>> minibatch_shares(const tensor_batch& b, int64_t epochs,
                                                     int64_t minibatches, uint64_t seed,
                                                     bool shuffle, size_t n) {
  auto mbs = make_minibatches(b, epochs, minibatches, seed, shuffle);
  if (!mbs)
    return mbs.error();
  std::vector<std::vector<tensor_batch>> per_rank(n);
  for (const auto& mb : *mbs) {
    if (mb.size() % static_cast<int64_t>(n) != 0)
      return make_error(errc::invalid_argument,
                        "a minibatch of " + std::to_string(mb.size()) + " rows does not divide over " +
                            std::to_string(n) + " DP ranks");
    auto parts = mb.split(static_cast<int64_t>(n));
    if (!parts)
      return parts.error();
    for (size_t r = 0; r < n; ++r)
      per_rank[r].push_back(std::move((*parts)[r]));
  }
  std::vector<tensor_batch> out;
  for (auto& p : per_rank) {
    auto c = tensor_batch::concat(p);
    if (!c)
      return c.error();
    out.push_back(std::move(*c));
  }
  return out;
}

// The answers of each replica's first rank (NOTE [tensor-parallel
// dispatch]), combined.
template <class Combine>
auto of_replicas(int width, Combine combine) {
  return [width, combine](const auto& parts) {
    std::decay_t<decltype(parts)> mine;
    for (size_t i = 0; i < parts.size(); i += static_cast<size_t>(width))
      mine.push_back(parts[i]);
    return combine(mine);
  };
}

// split: the rows of `b` over the replicas, send(rank, its replica's rows)
// asking each rank; `unit` names the rows when the split must be even ("" =
// uneven is fine).
template <class R, class Send, class Combine>
caf::result<R> split(group_ptr self, const tensor_batch& b, const char* what, const char* unit,
                     Send send, Combine combine) {
  auto n = static_cast<int64_t>(self->state.replicas());
  if (*unit && b.size() % n != 0)
    return with_prefix(make_error(errc::invalid_argument, "a batch of " + std::to_string(b.size()) + " " +
                                                              unit + " does not divide over " +
                                                              std::to_string(n) + " DP ranks"),
                       self->state.role + ": " + what);
  if (self->state.strategy == dp_strategy::zero3 && b.size() < n)
    return with_prefix(make_error(errc::invalid_argument,
                                  "a batch of " + std::to_string(b.size()) + " rows for " +
                                      std::to_string(n) +
                                      " zero3 ranks: each rank gathers the weights with the "
                                      "others, so each needs a row"),
                       self->state.role + ": " + what);
  auto parts = split_rows(b, static_cast<size_t>(n));
  if (!parts)
    return with_prefix(parts.error(), self->state.role + ": " + what);
  auto shared = std::make_shared<std::vector<tensor_batch>>(std::move(*parts));
  const auto width = static_cast<size_t>(self->state.width());
  return fan_out<R, R>(
      self, shared->size() * width,
      [=](size_t r) { return send(self->state.ranks[r], (*shared)[r / width]); },
      of_replicas(self->state.width(), combine));
}

// NOTE [dispatch modes], zero3: rank 0's answer needs the whole weights,
// which the ranks gather together, so the others make the same passes at
// the same time — `peer(rank)` — and their answers are dropped.
template <class R, class P, class Ask, class Peer>
caf::typed_response_promise<R> with_peers(group_ptr self, Ask ask, Peer peer) {
  auto rp = self->template make_response_promise<R>();
  struct state {
    std::optional<R> answer;
    size_t left = 0;
    bool done = false;
    caf::error held; // NOTE [the cause first] in actors/fan_out.hpp
  };
  auto g = std::make_shared<state>();
  g->left = self->state.ranks.size();
  auto finish = [=]() mutable {
    if (--g->left == 0 && !g->done) {
      g->done = true;
      if (g->held)
        rp.deliver(std::move(g->held));
      else
        rp.deliver(std::move(*g->answer));
    }
  };
  auto fail = [=](caf::error& e) mutable {
    if (g->done)
      return;
    if (code_of(e) == errc::unavailable) {
      if (!g->held)
        g->held = std::move(e);
      finish();
      return;
    }
    g->done = true;
    rp.deliver(std::move(e));
  };
  ask(self->state.ranks[0])
      .then(
          [=](R& x) mutable {
            g->answer = std::move(x);
            finish();
          },
          fail);
  for (size_t r = 1; r < self->state.ranks.size(); ++r)
    peer(self->state.ranks[r]).then([=](P&) mutable { finish(); }, fail);
  return rp;
}

// Ending the group ends its ranks; a rank that goes down ends the group.
void bind_to_ranks(group_ptr self) {
  auto members = self->state.ranks;
  self->attach_functor([members](const caf::error&) {
    for (const auto& r : members)
      caf::anon_send_exit(r, caf::exit_reason::user_shutdown);
  });
  for (const auto& r : self->state.ranks)
    self->monitor(r);
  self->set_down_handler([self](caf::down_msg& dm) {
    for (size_t r = 0; r < self->state.ranks.size(); ++r)
      if (self->state.ranks[r].address() == dm.source)
        self->quit(dm.reason ? dm.reason
                             : make_error(errc::unavailable, self->state.role + ": DP rank " +
                                                                 std::to_string(r) + " ended"));
  });
}

// NOTE [dispatch modes]: rank 0 answers `atom`; under zero3 every other rank
// makes the same passes alongside — the same request (peers_do::same) or a
// gather of the weights (peers_do::gather) — and its answer is dropped.
enum class peers_do { same, gather };

template <class R, class Atom, class... Ts>
caf::result<R> from_rank0(group_ptr self, peers_do peers, Atom atom, const Ts&... xs) {
  if (!self->state.gathers_together())
    return self->delegate(self->state.ranks[0], atom, xs...);
  auto ask = [=](const engine_actor& a) { return self->request(a, caf::infinite, atom, xs...); };
  if (peers == peers_do::same)
    return with_peers<R, R>(self, ask, ask);
  return with_peers<R, int64_t>(self, ask, [=](const engine_actor& a) {
    return self->request(a, caf::infinite, gather_weights_atom::value);
  });
}

// The same request to every rank, the answers combined.
template <class R, class Combine, class... Ts>
caf::typed_response_promise<R> to_all(group_ptr self, Combine combine, Ts... xs) {
  return fan_out<R, R>(
      self, self->state.ranks.size(),
      [=](size_t r) { return self->request(self->state.ranks[r], caf::infinite, xs...); }, combine);
}

// Every rank's shards, in rank order.
expected<state_shards> all_shards(std::vector<state_shards>& parts) {
  state_shards all;
  for (auto& p : parts)
    for (auto& s : p.shards)
      all.shards.push_back(std::move(s));
  return all;
}

// Rank 0's answer (the others answered the same or their part of it).
template <class T>
expected<T> first_answer(const std::vector<T>& parts) {
  return parts[0];
}

// A whole training state is one rank's: under TP or PP each rank holds
// other parts of the parameters (checkpoints take the shards instead).
std::optional<caf::error> no_tp_state(group_ptr self, const char* what) {
  if (self->state.width() == 1)
    return std::nullopt;
  return make_error(errc::unsupported, self->state.role + ": " + what +
                                           ": training states of model-parallel ranks (tp " +
                                           std::to_string(self->state.tp) + ", pp " +
                                           std::to_string(self->state.pp) +
                                           ") are not supported yet");
}

// NOTE [sharded state]: each rank its own shard, none gathered, in rank
// order; under TP and PP (NOTE [tensor-parallel dispatch]) rank d · w + i
// of a replica of w ranks loads the shards of position i (the parts of the
// parameters it holds), from whatever DP size saved them.
caf::typed_response_promise<state_shards> save_shards(group_ptr self) {
  const auto tp = self->state.tp, pp = self->state.pp;
  return to_all<state_shards>(
      self,
      [tp, pp](std::vector<state_shards>& parts) {
        auto all = all_shards(parts);
        if (all) {
          all->tp = tp;
          all->pp = pp;
        }
        return all;
      },
      save_shards_atom::value);
}

caf::result<int64_t> load_shards(group_ptr self, const state_shards& shards) {
  const auto width = static_cast<size_t>(self->state.width());
  const auto& role = self->state.role;
  if (shards.tp != self->state.tp || shards.pp != self->state.pp)
    return make_error(errc::invalid_argument,
                      role + ": load_shards: the state was saved by tp " +
                          std::to_string(shards.tp) + ", pp " + std::to_string(shards.pp) +
                          " ranks, this role has tp " + std::to_string(self->state.tp) + ", pp " +
                          std::to_string(self->state.pp) +
                          " (a state loads under any dp, not another tp or pp yet)");
  if (shards.shards.size() % width != 0)
    return make_error(errc::corrupted,
                      role + ": load_shards: " + std::to_string(shards.shards.size()) +
                          " shards do not come from replicas of " + std::to_string(width) +
                          " ranks");
  auto of_position = std::make_shared<std::vector<state_shards>>(width);
  for (size_t i = 0; i < shards.shards.size(); ++i)
    (*of_position)[i % width].shards.push_back(shards.shards[i]);
  return fan_out<int64_t, int64_t>(
      self, self->state.ranks.size(),
      [=](size_t r) {
        return self->request(self->state.ranks[r], caf::infinite, load_shards_atom::value,
                             (*of_position)[r % width]);
      },
      first_answer<int64_t>);
}

// minibatch: rank r steps through its slice of every minibatch, unshuffled.
template <class Atom, class Options>
caf::result<served_metrics> minibatch_update(group_ptr self, Atom atom, const tensor_batch& b,
                                             const Options& o, const char* what) {
  auto shares = minibatch_shares(b, o.epochs, o.minibatches, o.shuffle_seed, o.shuffle,
                                 self->state.replicas());
  if (!shares)
    return with_prefix(shares.error(), self->state.role + ": " + what);
  auto local = o;
  local.epochs = 1;
  local.minibatches = o.epochs * o.minibatches;
  local.shuffle = false;
  auto shared = std::make_shared<std::vector<tensor_batch>>(std::move(*shares));
  return fan_out<served_metrics, served_metrics>(
      self, self->state.ranks.size(),
      [=](size_t r) {
        return self->request(self->state.ranks[r], caf::infinite, atom,
                             (*shared)[r / static_cast<size_t>(self->state.width())], local);
      },
      slowest(group_metrics));
}

engine_actor::behavior_type group_behavior(group_ptr self, std::string role,
                                           std::vector<engine_actor> ranks, dp_strategy strategy,
                                           int tp, int pp) {
  self->state.role = std::move(role);
  self->state.ranks = std::move(ranks);
  self->state.strategy = strategy;
  self->state.tp = tp;
  self->state.pp = pp;
  bind_to_ranks(self);
  auto rank = [self](size_t r) { return self->state.ranks[r]; };

  // Requests to the ranks relay the caller's: NOTE [relayed waits] in
  // actors/role_proxy.cpp (the group monitors its ranks and ends with the
  // first that goes down, failing what is open).
  // split: rows over ranks, tensors back concatenated.
  // The request `atom` with a rank's rows.
  auto ask = [self](auto atom) {
    return [self, atom](const engine_actor& a, const tensor_batch& p) {
      return self->request(a, caf::infinite, atom, p);
    };
  };
  return {
      [=](log_probs_atom, const tensor_batch& b, double temperature, bool entropy) {
        return split<served_batch>(
            self, b, "log_probs", "",
            [=](const engine_actor& a, const tensor_batch& p) {
              return self->request(a, caf::infinite, log_probs_atom::value, p, temperature, entropy);
            },
            slowest(concat_rows));
      },
      [=](values_atom, const tensor_batch& b) {
        return split<served_batch>(self, b, "values", "", ask(values_atom::value), slowest(concat_rows));
      },
      [=](scores_atom, const tensor_batch& b) {
        return split<served_batch>(self, b, "scores", "", ask(scores_atom::value), slowest(concat_rows));
      },
      [=](update_policy_atom a, const tensor_batch& b, const policy_update_options& o) {
        return minibatch_update(self, a, b, o, "update_policy");
      },
      [=](update_critic_atom a, const tensor_batch& b, const critic_update_options& o) {
        return minibatch_update(self, a, b, o, "update_critic");
      },
      [=](sft_step_atom a, const tensor_batch& b) {
        return split<metric_map>(self, b, "sft_step", "rows", ask(a), group_metrics);
      },
      [=](rm_step_atom a, const tensor_batch& b) {
        return split<metric_map>(self, b, "rm_step", "pairs", ask(a), group_metrics);
      },
      [=](dpo_step_atom a, const tensor_batch& b, const dpo_step_options& o) {
        return split<metric_map>(
            self, b, "dpo_step", "pairs",
            [=](const engine_actor& m, const tensor_batch& p) {
              return self->request(m, caf::infinite, a, p, o);
            },
            group_metrics);
      },
      [=](rm_eval_atom a, const tensor_batch& b) -> caf::result<metric_map> {
        // Evaluation needs no group: rank 0 scores every pair.
        return from_rank0<metric_map>(self, peers_do::same, a, b);
      },
      [=](export_atom a) -> caf::result<actors::shared_weights> {
        return from_rank0<actors::shared_weights>(self, peers_do::gather, a);
      },
      [=](publish_atom a, int64_t v, const actors::weight_channel& c) -> caf::result<served_sync> {
        return from_rank0<served_sync>(self, peers_do::gather, a, v, c);
      },
      [=](save_model_atom a, const std::string& dir) -> caf::result<std::string> {
        return from_rank0<std::string>(self, peers_do::gather, a, dir);
      },
      [=](gather_weights_atom a) { return to_all<int64_t>(self, first_answer<int64_t>, a); },
      // Every rank: a sharded strategy gathers its optimizer state (NOTE
      // [training strategies]); rank 0's bytes are the state.
      [=](save_state_atom a) -> caf::result<std::string> {
        if (auto no = no_tp_state(self, "save_state"))
          return *no;
        return to_all<std::string>(self, first_answer<std::string>, a);
      },
      [=](load_state_atom a, const std::string& bytes) -> caf::result<int64_t> {
        if (auto no = no_tp_state(self, "load_state"))
          return *no;
        return to_all<int64_t>(self, first_answer<int64_t>, a, bytes);
      },
      [=](save_shards_atom) { return save_shards(self); },
      [=](load_shards_atom, const state_shards& shards) { return load_shards(self, shards); },
      [=](actors::release_atom a, const std::string& dir) {
        return to_all<served_bytes>(self, slowest(sum_bytes), a, dir);
      },
      [=](inject_failure_atom) { self->send(rank(0), inject_failure_atom::value); },
      // The cast sends kills to the rank it names (NOTE [kill injection]).
      [=](actors::inject_kill_atom, bool whole) {
        self->send(rank(0), actors::inject_kill_atom::value, whole);
      },
      [=](actors::inject_kill_atom, bool whole, int64_t nth) {
        self->send(rank(0), actors::inject_kill_atom::value, whole, nth);
      },
      [=](actors::inject_hang_atom, int64_t nth) {
        self->send(rank(0), actors::inject_hang_atom::value, nth);
      },
      // NOTE [peer state]: a survivor is asked directly; from the group, rank 0's.
      [=](peer_state_atom a, bool before_update) -> caf::result<std::string> {
        return self->delegate(self->state.ranks[0], a, before_update);
      },
  };
}

} // namespace

engine_actor spawn_engine_group(caf::actor_system& sys, std::string role,
                                std::vector<engine_actor> ranks, dp_strategy strategy, int tp,
                                int pp) {
  return sys.spawn(group_behavior, std::move(role), std::move(ranks), strategy, std::max(1, tp),
                   std::max(1, pp));
}

} // namespace troupe::actors::train
