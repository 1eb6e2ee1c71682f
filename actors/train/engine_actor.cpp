#include "actors/train/engine_actor.hpp"

#include "actors/exceptions.hpp"
#include "actors/kill_switch.hpp"

#include "runtime/compute.hpp"
#include "runtime/torch_guard.hpp"

#include <caf/all.hpp>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <stdexcept>

namespace troupe::actors::train {

namespace {

struct engine_state {
  std::shared_ptr<train_engine> eng;
  std::string role;
  bool fail_next = false;
  /// NOTE [kill injection].
  actors::kill_switch kill;
  actors::transport_cache transports;
  static inline const char* name = "train_engine";
};

using self_ptr = engine_actor::stateful_pointer<engine_state>;

// Runs one request and times it: the injected failure throws (ending the
// actor, as a crash would); errors get the role and request as prefix.
template <class T, class F>
expected<served<T>> run(self_ptr self, const char* request, F&& f) {
  auto& st = self->state;
  if (st.fail_next) {
    st.fail_next = false;
    throw std::runtime_error(st.role + ": " + request + ": injected failure");
  }
  auto t0 = std::chrono::steady_clock::now();
  expected<T> r = f(*st.eng);
  auto busy = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!r)
    return with_prefix(r.error(), st.role + ": " + request);
  return served<T>{std::move(*r), busy};
}

// A request whose reply carries its serving time (NOTE [busy on replies]).
template <class T, class F>
caf::result<served<T>> serve_timed(self_ptr self, const char* request, F&& f) {
  if (self->state.kill.fire(self)) // NOTE [kill injection]: nothing answers
    return caf::delegated<served<T>>{};
  auto r = run<T>(self, request, std::forward<F>(f));
  if (self->state.kill.fired_inside(self)) // NOTE [kill inside a collective]
    return caf::delegated<served<T>>{};
  if (!r)
    return r.error();
  return std::move(*r);
}

// A request that answers its value alone.
template <class T, class F>
caf::result<T> serve(self_ptr self, const char* request, F&& f) {
  if (self->state.kill.fire(self))
    return caf::delegated<T>{};
  auto r = run<T>(self, request, std::forward<F>(f));
  if (self->state.kill.fired_inside(self))
    return caf::delegated<T>{};
  if (!r)
    return r.error();
  return std::move(r->value);
}

// NOTE [sharded state]: this rank's shard, and a state from every rank's.
caf::result<state_shards> save_shards(self_ptr self) {
  return serve<state_shards>(self, "save_shards", [&](train_engine& e) -> expected<state_shards> {
    auto bytes = e.save_shard();
    if (!bytes)
      return bytes.error();
    return state_shards{{std::move(*bytes)}};
  });
}

caf::result<int64_t> load_shards(self_ptr self, const state_shards& shards) {
  return serve<int64_t>(self, "load_shards", [&](train_engine& e) -> expected<int64_t> {
    if (auto ok = e.load_shards(shards.shards); !ok)
      return ok.error();
    return e.steps();
  });
}

// NOTE [kill inside a collective]: the engine's DP group dies at its nth
// operation; an engine in none dies at its next request.
void arm_kill_in_collective(self_ptr self, bool whole_process, int64_t nth) {
  auto& st = self->state;
  if (!st.eng->die_in_collective(nth, st.kill.dying_hook(whole_process)))
    st.kill.arm(whole_process);
}

// NOTE [deadlocked collectives]: the engine's DP group blocks for good at
// its nth operation (only a worker's ranks are told to: their process is
// killed from outside); an engine in none dies at its next request.
void arm_hang_in_collective(self_ptr self, int64_t nth) {
  auto& st = self->state;
  if (!st.eng->die_in_collective(nth, kill_switch::hanging_hook()))
    st.kill.arm(true);
}

engine_actor::behavior_type behavior(self_ptr self, std::string role,
                                     std::shared_ptr<train_engine> eng) {
  self->state.eng = std::move(eng);
  self->state.role = std::move(role);
  // A throwing handler ends the actor; the request it served fails with the
  // exception's message (NOTE [escaping exceptions]).
  self->set_exception_handler([](std::exception_ptr& ep) { return error_of_exception(ep, ""); });
  using runtime::tensor_batch;
  return {
      [=](log_probs_atom, const tensor_batch& b, double temperature, bool entropy) {
        return serve_timed<tensor_batch>(self, "log_probs",
                                   [&](train_engine& e) { return e.log_probs(b, temperature, entropy); });
      },
      [=](values_atom, const tensor_batch& b) {
        return serve_timed<tensor_batch>(self, "values", [&](train_engine& e) { return e.values(b); });
      },
      [=](scores_atom, const tensor_batch& b) {
        return serve_timed<tensor_batch>(self, "scores", [&](train_engine& e) { return e.scores(b); });
      },
      [=](update_policy_atom, const tensor_batch& b, const policy_update_options& o) {
        return serve_timed<metric_map>(self, "update_policy",
                                 [&](train_engine& e) { return e.update_policy(b, o); });
      },
      [=](update_critic_atom, const tensor_batch& b, const critic_update_options& o) {
        return serve_timed<metric_map>(self, "update_critic",
                                 [&](train_engine& e) { return e.update_critic(b, o); });
      },
      [=](sft_step_atom, const tensor_batch& b) {
        return serve<metric_map>(self, "sft_step", [&](train_engine& e) { return e.sft_step(b); });
      },
      [=](rm_step_atom, const tensor_batch& b) {
        return serve<metric_map>(self, "rm_step", [&](train_engine& e) { return e.rm_step(b); });
      },
      [=](rm_eval_atom, const tensor_batch& b) {
        return serve<metric_map>(self, "rm_eval", [&](train_engine& e) { return e.rm_eval(b); });
      },
      [=](dpo_step_atom, const tensor_batch& b, const dpo_step_options& o) {
        return serve<metric_map>(self, "dpo_step",
                                 [&](train_engine& e) { return e.dpo_step(b, o); });
      },
      [=](export_atom) {
        return serve<actors::shared_weights>(
            self, "export_weights", [&](train_engine& e) -> expected<actors::shared_weights> {
              return guarded("export_weights", [&] {
                return actors::shared_weights{
                    std::make_shared<const std::map<std::string, at::Tensor>>(e.export_weights())};
              });
            });
      },
      [=](publish_atom, int64_t version, const actors::weight_channel& c) {
        return serve_timed<actors::sync_bytes>(
            self, "publish_weights", [&](train_engine& e) -> expected<actors::sync_bytes> {
              auto t =
                  actors::open_channel(self->state.transports, c, actors::channel_side::publisher);
              if (!t)
                return t.error();
              // NOTE [streamed publish]: the transport takes each tensor as
              // the export makes it (a zero3 unit at a time).
              auto layout = guarded("export_weights", [&] { return e.export_layout(); });
              if (!layout)
                return layout.error();
              if (auto ok = (*t)->publish_streamed(
                      version, *layout,
                      [&](const runtime::tensor_sink& put) { return e.export_weights_to(put); });
                  !ok)
                return ok.error();
              actors::sync_bytes out;
              for (const auto& spec : *layout)
                out.bytes += spec.bytes();
              // NOTE [sync staging]: the transport's copy and the export's gathers.
              out.temporary = out.bytes + e.export_spike_bytes();
              return out;
            });
      },
      [=](gather_weights_atom) {
        return serve<int64_t>(self, "gather_weights",
                              [&](train_engine& e) { return e.gather_weights(); });
      },
      [=](save_model_atom, const std::string& dir) {
        return serve<std::string>(self, "save_model", [&](train_engine& e) -> expected<std::string> {
          if (auto ok = e.save_pretrained(dir); !ok)
            return ok.error();
          return dir;
        });
      },
      [=](save_state_atom) {
        return serve<std::string>(self, "save_state", [&](train_engine& e) { return e.save_state(); });
      },
      [=](load_state_atom, const std::string& bytes) {
        return serve<int64_t>(self, "load_state", [&](train_engine& e) -> expected<int64_t> {
          if (auto ok = e.load_state(bytes); !ok)
            return ok.error();
          return e.steps();
        });
      },
      [=](save_shards_atom) { return save_shards(self); },
      [=](load_shards_atom, const state_shards& shards) { return load_shards(self, shards); },
      [=](actors::release_atom, const std::string& dir) {
        return serve_timed<int64_t>(self, "release", [&](train_engine& e) {
          return release_engine(e, dir, self->state.role);
        });
      },
      [=](inject_failure_atom) { self->state.fail_next = true; },
      [=](actors::inject_kill_atom, bool whole_process) { self->state.kill.arm(whole_process); },
      [=](actors::inject_kill_atom, bool whole_process, int64_t nth) {
        arm_kill_in_collective(self, whole_process, nth);
      },
      [=](actors::inject_hang_atom, int64_t nth) { arm_hang_in_collective(self, nth); },
      [=](peer_state_atom, bool before_update) {
        return serve<std::string>(self, "peer_state", [&](train_engine& e) {
          return before_update ? e.state_before_update() : e.save_state();
        });
      },
  };
}

} // namespace

expected<int64_t> release_engine(train_engine& e, const std::string& dir, const std::string& role) {
  std::string file;
  for (char c : role)
    file += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return make_error(errc::io_error, "cannot create " + dir + ": " + ec.message());
  // A trainer frees its optimizer state and gradients; a frozen model
  // (reference, reward model) its weights.
  auto base = std::filesystem::path{dir} / file;
  auto bytes = e.trainable() ? e.offload_optimizer(base.string() + ".optim")
                             : e.offload_weights(base.string() + ".weights");
  runtime::return_free_memory();
  return bytes;
}

engine_actor spawn_engine_actor(caf::actor_system& sys, std::string role,
                                std::unique_ptr<train_engine> engine) {
  std::shared_ptr<train_engine> shared{std::move(engine)};
  return sys.spawn<caf::detached>(behavior, std::move(role), std::move(shared));
}

} // namespace troupe::actors::train
