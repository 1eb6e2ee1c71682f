#include "actors/role_proxy.hpp"

#include "actors/inference/rollout.hpp"
#include "actors/train/engine_actor.hpp"
#include "runtime/error.hpp"
#include "runtime/tensor_batch.hpp"

#include <caf/all.hpp>

#include <map>
#include <vector>

namespace troupe::actors {

namespace {

using proxy_idle_atom = caf::atom_constant<caf::atom("pxidle")>;

struct proxy_state {
  caf::actor target;
  std::string label;
  uint64_t next = 0;
  std::map<uint64_t, caf::response_promise> open;
  /// Set once the target went down: the answer to every later request.
  caf::error down;
  static inline const char* name = "role_proxy";
};

caf::behavior proxy(caf::stateful_actor<proxy_state>* self, caf::actor target, std::string name) {
  self->state.target = target;
  self->state.label = std::move(name);
  self->monitor(target);
  self->attach_functor([target](const caf::error&) {
    caf::anon_send_exit(target, caf::exit_reason::user_shutdown);
  });
  self->set_down_handler([self](caf::down_msg& dm) {
    if (dm.source != self->state.target.address())
      return;
    auto err = make_error(errc::lost,
                          self->state.label + " went down: " + self->system().render(dm.reason));
    for (auto& [id, rp] : self->state.open)
      rp.deliver(err);
    self->state.open.clear();
    self->state.down = err;
  });
  self->set_default_handler([self](caf::scheduled_actor*, caf::message_view& x) -> caf::result<caf::message> {
    if (self->state.down)
      return self->state.down;
    auto msg = x.move_content_to_message();
    if (!self->current_message_id().is_request()) {
      self->send(self->state.target, std::move(msg));
      return caf::delegated<caf::message>{};
    }
    auto id = self->state.next++;
    self->state.open.emplace(id, self->make_response_promise());
    // NOTE [relayed waits]: a relay (this proxy, an engine group) forwards a
    // caller's request without a deadline of its own; the wait is bounded
    // anyway. The caller's request carries the caller's timeout (from
    // run.timeouts), so the caller gets its answer or its timeout whatever
    // the relay does; and the relay monitors its target, so a target that
    // goes down fails every open relayed request at once. What a relay
    // keeps past a caller's timeout is one response handler, until the
    // target answers or ends. (CAF 0.17 messages carry no deadline to pass on.)
    auto h = self->request(self->state.target, caf::infinite, std::move(msg));
    // The answer types of the role interfaces (a new one must be added
    // here: an answer of another type fails the request, never hangs it).
    auto relay = [self, id](auto& reply) {
      auto it = self->state.open.find(id);
      if (it == self->state.open.end())
        return;
      it->second.deliver(std::move(reply));
      self->state.open.erase(it);
    };
    self->add_multiplexed_response_handler(
        h.id(), caf::behavior{
                    [relay](runtime::tensor_batch& x) { relay(x); },
                    [relay](runtime::metric_map& x) { relay(x); },
                    [relay](train::served_batch& x) { relay(x); },
                    [relay](train::served_metrics& x) { relay(x); },
                    [relay](train::served_bytes& x) { relay(x); },
                    [relay](train::served_sync& x) { relay(x); },
                    [relay](actors::sync_bytes& x) { relay(x); },
                    [relay](train::state_shards& x) { relay(x); },
                    [relay](inference::generation& x) { relay(x); },
                    [relay](inference::engine_metrics& x) { relay(x); },
                    [relay](std::string& x) { relay(x); },
                    [relay](std::vector<std::string>& x) { relay(x); }, // a rollout's restore
                    [relay](int64_t& x) { relay(x); },
                    [relay](bool& x) { relay(x); }, // a rollout rank's drive
                    [relay](caf::error& x) { relay(x); },
                });
    return caf::delegated<caf::message>{};
  });
  // Every message goes to the default handler; this one never arrives.
  return {[](proxy_idle_atom) {}};
}

} // namespace

caf::actor spawn_role_proxy(caf::actor_system& sys, caf::actor target, std::string name) {
  // Detached: a relay on the scheduler's pool waits for an idle worker
  // thread to wake from its relaxed polling (up to 10 ms a hop); bench_job
  // measured 2.5 points of a PPO step's orchestration share that way.
  return sys.spawn<caf::detached>(proxy, std::move(target), std::move(name));
}

} // namespace troupe::actors
