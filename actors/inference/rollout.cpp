#include "actors/inference/rollout.hpp"

#include "actors/exceptions.hpp"

#include "runtime/binary_form.hpp"
#include "runtime/compute.hpp"

#include "models/llama.hpp"

#include <caf/all.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <set>

namespace troupe::actors::inference {

namespace {

struct open_call {
  caf::typed_response_promise<generation> promise;
  std::vector<std::string> order; ///< request ids, in the caller's order
  std::map<std::string, request_output> done;
};

/// A collect call waiting for requests generated ahead.
struct open_collect {
  caf::typed_response_promise<generation> promise;
  std::vector<std::string> ids;
};

/// What a snapshot holds besides the engine's requests: the outputs of
/// requests generated ahead that finished and wait to be collected.
struct rollout_record {
  std::vector<request_output> done;
  std::string engine;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollout_record& x) {
  return f(caf::meta::type_name("rollout_record"), x.done, x.engine);
}

struct rollout_state {
  rollout_options options; // first: what the model refers to goes last
  std::shared_ptr<engine> eng;
  std::map<uint64_t, open_call> calls;
  std::map<std::string, uint64_t> call_of; ///< request id → call
  uint64_t next_call = 0;
  /// NOTE [batches ahead]: in the engine, and finished (until collected).
  std::set<std::string> ahead_open;
  std::map<std::string, request_output> ahead_done;
  std::vector<open_collect> collects;
  /// NOTE [paced rollout]: steps left of the latest generate ahead, and
  /// the messages held until no step may run.
  int64_t allowance = 0;
  std::deque<std::function<void()>> held;
  bool stepping = false;
  bool threads_set = false;
  transport_cache transports;
  /// NOTE [kill injection]: fires at the next message that changes work.
  kill_switch kill;
  static inline const char* name = "rollout";
};

using self_ptr = rollout_actor::stateful_pointer<rollout_state>;

// Calls that make the engine step until they are answered.
bool has_callers(const rollout_state& st) {
  return !st.calls.empty() || !st.collects.empty();
}

// NOTE [paced rollout]: whether a step may run now (there is work, and
// either no pace or a reason to step).
bool may_step(const rollout_state& st) {
  return !st.eng->idle() && (st.options.pace == 0 || st.allowance > 0 || has_callers(st));
}

void schedule_step(self_ptr self) {
  auto& st = self->state;
  if (!st.options.driven && !st.stepping && may_step(st)) {
    st.stepping = true;
    self->send(self, step_atom::value);
  }
}

// Runs `apply` now, or once no step may run (NOTE [paced rollout]); without
// a pace, always now.
void when_settled(self_ptr self, std::function<void()> apply) {
  auto& st = self->state;
  if (st.kill.fire(self))
    return; // the call's promise goes unanswered
  if (st.options.pace == 0 || (st.held.empty() && !may_step(st)))
    apply();
  else
    st.held.push_back(std::move(apply));
}

// Applies the held messages in order while no step may run.
void apply_held(self_ptr self) {
  auto& st = self->state;
  while (!st.held.empty() && !may_step(st)) {
    auto next = std::move(st.held.front());
    st.held.pop_front();
    next();
  }
}

// A reply computed when the message is applied (when_settled).
template <class T>
caf::result<T> settled(self_ptr self, std::function<expected<T>()> f) {
  auto promise = self->make_response_promise<T>();
  when_settled(self, [promise, f = std::move(f)]() mutable {
    auto r = f();
    if (r)
      promise.deliver(std::move(*r));
    else
      promise.deliver(r.error());
  });
  return promise;
}

void fail_all(self_ptr self, const caf::error& err) {
  for (auto& [id, call] : self->state.calls)
    call.promise.deliver(err);
  for (auto& c : self->state.collects)
    c.promise.deliver(err);
  self->state.calls.clear();
  self->state.call_of.clear();
  self->state.collects.clear();
}

// Answers the collect calls whose requests have all finished.
void answer_collects(self_ptr self) {
  auto& st = self->state;
  for (auto it = st.collects.begin(); it != st.collects.end();) {
    bool ready = std::all_of(it->ids.begin(), it->ids.end(),
                             [&](const std::string& id) { return st.ahead_done.count(id) != 0; });
    if (!ready) {
      ++it;
      continue;
    }
    generation g;
    for (const auto& id : it->ids) {
      auto done = st.ahead_done.find(id);
      g.outputs.push_back(std::move(done->second));
      st.ahead_done.erase(done);
    }
    g.engine = st.eng->metrics();
    it->promise.deliver(std::move(g));
    it = st.collects.erase(it);
  }
}

// An output the engine finished: to its call, or kept for a collect.
void deliver_output(self_ptr self, request_output&& out) {
  auto& st = self->state;
  if (st.ahead_open.erase(out.id) != 0) {
    auto id = out.id;
    st.ahead_done.insert_or_assign(std::move(id), std::move(out));
    return;
  }
  auto it = st.call_of.find(out.id);
  if (it == st.call_of.end())
    return; // cannot happen: every queued request belongs to a call
  auto call_id = it->second;
  st.call_of.erase(it);
  auto& call = st.calls.at(call_id);
  auto id = out.id;
  call.done.emplace(std::move(id), std::move(out));
  if (call.done.size() == call.order.size()) {
    generation g;
    g.outputs.reserve(call.order.size());
    for (const auto& rid : call.order)
      g.outputs.push_back(std::move(call.done.at(rid)));
    g.engine = st.eng->metrics();
    call.promise.deliver(std::move(g));
    st.calls.erase(call_id);
  }
}

// One engine step; answers the calls it finishes. A failing step fails
// every open call with its error, which it returns.
expected<void> run_step(self_ptr self) {
  auto& st = self->state;
  st.stepping = false;
  if (st.options.threads > 0 && !st.threads_set) { // on the actor's own thread
    runtime::set_thread_compute_threads(st.options.threads);
    st.threads_set = true;
  }
  auto outs = st.eng->step();
  if (!outs) {
    auto err = with_prefix(outs.error(), "rollout step");
    fail_all(self, err);
    return err;
  }
  if (st.allowance > 0)
    --st.allowance;
  if (st.eng->idle())
    st.allowance = 0;
  for (auto& out : *outs)
    deliver_output(self, std::move(out));
  answer_collects(self);
  return {};
}

void on_step(self_ptr self) {
  if (auto ok = run_step(self); !ok) {
    self->quit(ok.error());
    return;
  }
  apply_held(self);
  schedule_step(self);
}

// A generate call's requests join the engine (when_settled).
void open_generate(self_ptr self, std::vector<generate_request> requests,
                   caf::typed_response_promise<generation> promise) {
  auto& st = self->state;
  if (st.calls.empty()) // a new batch: a new window for the KV peak
    st.eng->reset_kv_peak();
  open_call call;
  for (const auto& r : requests)
    call.order.push_back(r.id);
  if (auto ok = st.eng->add_requests(std::move(requests)); !ok) {
    promise.deliver(ok.error());
    return;
  }
  call.promise = promise;
  auto id = st.next_call++;
  for (const auto& rid : call.order)
    st.call_of[rid] = id;
  st.calls.emplace(id, std::move(call));
  schedule_step(self);
}

// NOTE [batches ahead]: queued, collected later; with a pace, N steps.
expected<int64_t> generate_ahead(self_ptr self, std::vector<generate_request> requests) {
  auto& st = self->state;
  if (st.calls.empty() && st.ahead_open.empty()) // a new batch: a new window for the KV peak
    st.eng->reset_kv_peak();
  std::vector<std::string> ids;
  for (const auto& r : requests)
    ids.push_back(r.id);
  if (auto ok = st.eng->add_requests(std::move(requests)); !ok)
    return ok.error();
  st.ahead_open.insert(ids.begin(), ids.end());
  st.allowance = st.eng->idle() ? 0 : st.options.pace;
  schedule_step(self);
  return static_cast<int64_t>(ids.size());
}

void open_collect_call(self_ptr self, std::vector<std::string> ids,
                       caf::typed_response_promise<generation> promise) {
  auto& st = self->state;
  for (const auto& id : ids)
    if (!st.ahead_open.count(id) && !st.ahead_done.count(id)) {
      promise.deliver(make_error(errc::not_found, "rollout collect: request '" + id +
                                                      "' was not generated ahead, or was "
                                                      "collected already"));
      return;
    }
  st.collects.push_back({promise, std::move(ids)});
  answer_collects(self);
  schedule_step(self);
}

expected<std::string> snapshot(self_ptr self) {
  auto& st = self->state;
  if (!st.calls.empty())
    return make_error(errc::illegal_state, "rollout snapshot: " + std::to_string(st.calls.size()) +
                                               " generate calls are open; only requests "
                                               "generated ahead can be saved");
  rollout_record rec;
  for (const auto& [id, out] : st.ahead_done)
    rec.done.push_back(out);
  auto engine = st.eng->export_state();
  if (!engine)
    return with_prefix(engine.error(), "rollout snapshot");
  rec.engine = std::move(*engine);
  return runtime::to_bytes(rec, "rollout snapshot");
}

expected<std::vector<std::string>> restore(self_ptr self, const std::string& bytes) {
  auto& st = self->state;
  if (!st.calls.empty() || !st.ahead_open.empty() || !st.ahead_done.empty())
    return make_error(errc::illegal_state, "rollout restore: the rollout holds requests already");
  rollout_record rec;
  if (auto ok = runtime::from_bytes(bytes, rec, "rollout restore: the snapshot"); !ok)
    return ok.error();
  auto open = st.eng->import_state(rec.engine);
  if (!open)
    return with_prefix(open.error(), "rollout restore");
  std::vector<std::string> ids;
  for (auto& out : rec.done) {
    ids.push_back(out.id);
    auto id = out.id;
    st.ahead_done.insert_or_assign(std::move(id), std::move(out));
  }
  st.ahead_open.insert(open->begin(), open->end());
  ids.insert(ids.end(), open->begin(), open->end());
  st.allowance = 0;
  return ids;
}

rollout_actor::behavior_type rollout_behavior(self_ptr self, std::shared_ptr<engine> eng,
                                              rollout_options options) {
  self->state.eng = std::move(eng);
  self->state.options = options;
  // An exception (in a step, say) ends the engine: every open generate call
  // fails with its message (NOTE [escaping exceptions]).
  self->set_exception_handler([self](std::exception_ptr& ep) {
    auto err = error_of_exception(ep, "rollout");
    fail_all(self, err);
    return err;
  });
  return {
      [=](generate_atom, std::vector<generate_request>& requests) -> caf::result<generation> {
        if (requests.empty())
          return generation{{}, self->state.eng->metrics()};
        auto promise = self->make_response_promise<generation>();
        when_settled(self, [self, promise, rs = std::move(requests)]() mutable {
          open_generate(self, std::move(rs), promise);
        });
        return promise;
      },
      [=](generate_atom, ahead_atom, std::vector<generate_request>& requests) {
        return settled<int64_t>(self, [self, rs = std::move(requests)]() mutable {
          return generate_ahead(self, std::move(rs));
        });
      },
      [=](collect_atom, std::vector<std::string>& ids) -> caf::result<generation> {
        auto promise = self->make_response_promise<generation>();
        when_settled(self, [self, promise, ids = std::move(ids)]() mutable {
          open_collect_call(self, std::move(ids), promise);
        });
        return promise;
      },
      [=](snapshot_atom) { return settled<std::string>(self, [self] { return snapshot(self); }); },
      [=](restore_atom, std::string& bytes) {
        return settled<std::vector<std::string>>(
            self, [self, bytes = std::move(bytes)] { return restore(self, bytes); });
      },
      [=](load_weights_atom, int64_t version, const shared_weights& weights) {
        return settled<int64_t>(self, [self, version, weights]() -> expected<int64_t> {
          if (!weights)
            return make_error(errc::invalid_argument, "rollout load_weights: no tensors");
          if (auto ok = self->state.eng->load_weights(version, *weights); !ok)
            return ok.error();
          return version;
        });
      },
      [=](receive_weights_atom, int64_t version, const weight_channel& c) {
        return settled<sync_bytes>(self, [self, version, c]() -> expected<sync_bytes> {
          auto t = open_channel(self->state.transports, c, channel_side::receiver);
          if (!t)
            return with_prefix(t.error(), "rollout receive_weights");
          sync_bytes out;
          {
            // Dropped before answering: an shm slot is free again at once.
            auto got = (*t)->receive(version);
            if (!got)
              return with_prefix(got.error(), "rollout receive_weights");
            if (auto ok = self->state.eng->load_weights(version, got->tensors); !ok)
              return ok.error();
            out.bytes = static_cast<int64_t>(got->bytes);
          }
          // NOTE [sync staging]: held while loading, where the transport stages it.
          out.temporary = runtime::traits_of(c.kind).receiver_stages ? out.bytes : 0;
          return out;
        });
      },
      [=](metrics_atom) { return self->state.eng->metrics(); },
      [=](inject_kill_atom, bool whole) { self->state.kill.arm(whole); },
      [=](clear_cache_atom) {
        return settled<int64_t>(self, [self]() -> expected<int64_t> {
          self->state.eng->clear_prefix_cache();
          return self->state.eng->free_blocks();
        });
      },
      [=](release_atom) {
        return settled<int64_t>(self, [self]() -> expected<int64_t> {
          auto bytes = self->state.eng->release_kv_cache();
          if (!bytes)
            return with_prefix(bytes.error(), "rollout release");
          runtime::return_free_memory();
          return *bytes;
        });
      },
      [=](drive_atom) -> caf::result<bool> {
        if (auto ok = run_step(self); !ok) {
          self->quit(ok.error());
          return ok.error();
        }
        return !self->state.eng->idle();
      },
      [=](step_atom) { on_step(self); },
  };
}

} // namespace

expected<rollout_actor> spawn_rollout(caf::actor_system& sys, models::llama_model model,
                                      const engine_config& config, rollout_options options) {
  auto eng = engine::make(std::move(model), config);
  if (!eng)
    return eng.error();
  std::shared_ptr<engine> shared = std::move(*eng);
  return sys.spawn<caf::detached>(rollout_behavior, std::move(shared), options);
}

std::vector<std::pair<std::string, double>> rollout_metrics(const engine_metrics& m) {
  return {
      {"rollout/tokens_per_s", m.tokens_per_second()},
      {"rollout/ttft_ms", m.mean_ttft_ms()},
      {"rollout/itl_ms", m.mean_itl_ms()},
      {"rollout/kv_utilization", m.kv_utilization},
      {"rollout/prefix_hit_rate", m.prefix_hit_rate},
      {"rollout/preemptions", static_cast<double>(m.preemptions)},
      {"rollout/generated_tokens", static_cast<double>(m.generated_tokens)},
      {"rollout/prefill_tokens", static_cast<double>(m.prefill_tokens_computed)},
      {"rollout/recomputed_tokens", static_cast<double>(m.recomputed_tokens)},
      {"rollout/steps", static_cast<double>(m.steps)},
      {"rollout/fused_decode_steps", static_cast<double>(m.fused_decode_steps)},
      {"rollout/aten_decode_steps", static_cast<double>(m.aten_decode_steps)},
  };
}

} // namespace troupe::actors::inference
