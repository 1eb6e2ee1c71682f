#include "actors/inference/rollout.hpp"

#include "actors/exceptions.hpp"

#include "runtime/compute.hpp"

#include "models/llama.hpp"

#include <caf/all.hpp>

#include <torch/torch.h>

namespace troupe::actors::inference {

namespace {

struct open_call {
  caf::typed_response_promise<generation> promise;
  std::vector<std::string> order; ///< request ids, in the caller's order
  std::map<std::string, request_output> done;
};

struct rollout_state {
  rollout_options options; // first: what the model refers to goes last
  std::shared_ptr<engine> eng;
  std::map<uint64_t, open_call> calls;
  std::map<std::string, uint64_t> call_of; ///< request id → call
  uint64_t next_call = 0;
  bool stepping = false;
  bool threads_set = false;
  transport_cache transports;
  static inline const char* name = "rollout";
};

using self_ptr = rollout_actor::stateful_pointer<rollout_state>;

void schedule_step(self_ptr self) {
  if (!self->state.options.driven && !self->state.stepping && !self->state.eng->idle()) {
    self->state.stepping = true;
    self->send(self, step_atom::value);
  }
}

void fail_all(self_ptr self, const caf::error& err) {
  for (auto& [id, call] : self->state.calls)
    call.promise.deliver(err);
  self->state.calls.clear();
  self->state.call_of.clear();
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
  for (auto& out : *outs) {
    auto it = st.call_of.find(out.id);
    if (it == st.call_of.end())
      continue; // cannot happen: every queued request belongs to a call
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
  return {};
}

void on_step(self_ptr self) {
  if (auto ok = run_step(self); !ok) {
    self->quit(ok.error());
    return;
  }
  schedule_step(self);
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
        auto& st = self->state;
        if (requests.empty())
          return generation{{}, st.eng->metrics()};
        if (st.calls.empty()) // a new batch: a new window for the KV peak
          st.eng->reset_kv_peak();
        open_call call;
        for (const auto& r : requests)
          call.order.push_back(r.id);
        if (auto ok = st.eng->add_requests(std::move(requests)); !ok)
          return ok.error();
        call.promise = self->make_response_promise<generation>();
        auto id = st.next_call++;
        for (const auto& rid : call.order)
          st.call_of[rid] = id;
        auto promise = call.promise;
        st.calls.emplace(id, std::move(call));
        schedule_step(self);
        return promise;
      },
      [=](load_weights_atom, int64_t version,
          const shared_weights& weights) -> caf::result<int64_t> {
        if (!weights)
          return make_error(errc::invalid_argument, "rollout load_weights: no tensors");
        if (auto ok = self->state.eng->load_weights(version, *weights); !ok)
          return ok.error();
        return version;
      },
      [=](receive_weights_atom, int64_t version,
          const weight_channel& c) -> caf::result<sync_bytes> {
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
      },
      [=](metrics_atom) { return self->state.eng->metrics(); },
      [=](clear_cache_atom) {
        self->state.eng->clear_prefix_cache();
        return self->state.eng->free_blocks();
      },
      [=](release_atom) -> caf::result<int64_t> {
        auto bytes = self->state.eng->release_kv_cache();
        if (!bytes)
          return with_prefix(bytes.error(), "rollout release");
        runtime::return_free_memory();
        return *bytes;
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
