#include "actors/actor_system.hpp"

#include "actors/inference/rollout.hpp"
#include "actors/job/job_actor.hpp"
#include "actors/rl/reward.hpp"
#include "actors/rl/roles.hpp"
#include "actors/train/engine_actor.hpp"
#include "runtime/tensor_batch.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <chrono>

namespace troupe::actors {

using ping_atom = caf::atom_constant<caf::atom("ping")>;

void configure(caf::actor_system_config& cfg) {
  // NOTE [scheduler polling]: an idle CAF worker first spins briefly
  // (aggressive polling), then by default polls 500 times with a 50 us
  // sleep between tries before it waits on its condition variable. The job
  // actor and the event sinks wake the workers a few dozen times per RL
  // iteration, so with the default all four workers spent most of the
  // iteration in that sleep-and-poll phase: ~20,000 wake-ups a second that
  // preempt the roles' LibTorch threads (a PPO step 10-12 % slower on two
  // cores, bench_job before/after). Without the moderate phase a worker
  // goes from spinning straight to its condition variable, which an enqueue
  // notifies: the round trip stays the same (bench_job) and compute keeps
  // the cores.
  cfg.set("work-stealing.moderate-poll-attempts", size_t{0});
  cfg.add_error_category(error_category(), [](uint8_t code, caf::atom_value,
                                              const caf::message& ctx) {
    std::string out{to_string(static_cast<errc>(code))};
    if (ctx.size() == 1 && ctx.match_element<std::string>(0))
      out += ": " + ctx.get_as<std::string>(0);
    return out;
  });
  // Serialisable messages (they may cross processes).
  cfg.add_message_type<actors::weight_channel>("weight_channel");
  cfg.add_message_type<runtime::tensor_batch>("tensor_batch");
  cfg.add_message_type<runtime::metric_map>("metric_map");
  cfg.add_message_type<train::policy_update_options>("policy_update_options");
  cfg.add_message_type<train::dpo_step_options>("dpo_step_options");
  cfg.add_message_type<train::critic_update_options>("critic_update_options");
  cfg.add_message_type<rl::reward_request>("reward_request");
  cfg.add_message_type<rl::role_spec>("role_spec");
  cfg.add_message_type<inference::generate_request>("generate_request");
  cfg.add_message_type<std::vector<inference::generate_request>>("std::vector<generate_request>");
  cfg.add_message_type<inference::request_output>("request_output");
  cfg.add_message_type<std::vector<inference::request_output>>("std::vector<request_output>");
  cfg.add_message_type<inference::engine_metrics>("engine_metrics");
  cfg.add_message_type<inference::generation>("generation");
  cfg.add_message_type<train::served_batch>("served<tensor_batch>");
  cfg.add_message_type<train::served_metrics>("served<metric_map>");
  cfg.add_message_type<train::served_bytes>("served<int64_t>");
  cfg.add_message_type<actors::sync_bytes>("sync_bytes");
  cfg.add_message_type<train::served_sync>("served<sync_bytes>");
  cfg.add_message_type<train::state_shards>("state_shards");
  cfg.add_message_type<job::event>("job_event");
  cfg.add_message_type<job::job_status>("job_status");
}

namespace {

using run_atom = caf::atom_constant<caf::atom("run")>;

caf::behavior echo(caf::event_based_actor*) {
  return {[](ping_atom, int64_t x) { return x; }};
}

/// Event-based client: issues `count` sequential requests to `server`,
/// timing each, and answers the `run` request with the latencies.
struct prober_state {
  std::vector<double> us;
  std::chrono::steady_clock::time_point sent;
  caf::response_promise done;
};

void probe_next(caf::stateful_actor<prober_state>* self, caf::actor server, int remaining,
                int64_t timeout_ms) {
  if (remaining == 0) {
    self->state.done.deliver(std::move(self->state.us));
    return;
  }
  auto i = static_cast<int64_t>(self->state.us.size());
  self->state.sent = std::chrono::steady_clock::now();
  self->request(server, std::chrono::milliseconds(timeout_ms), ping_atom::value, i)
    .then(
      [=](int64_t back) {
        auto now = std::chrono::steady_clock::now();
        if (back != i) {
          self->state.done.deliver(make_error(errc::internal, "echo answered the wrong request"));
          return;
        }
        self->state.us.push_back(
          std::chrono::duration<double, std::micro>(now - self->state.sent).count());
        probe_next(self, server, remaining - 1, timeout_ms);
      },
      [=](caf::error& err) { self->state.done.deliver(std::move(err)); });
}

caf::behavior prober(caf::stateful_actor<prober_state>* self, caf::actor server, int count,
                     int64_t timeout_ms) {
  return {[=](run_atom) -> caf::result<std::vector<double>> {
    self->state.us.reserve(static_cast<size_t>(count));
    self->state.done = self->make_response_promise();
    probe_next(self, server, count, timeout_ms);
    return self->state.done;
  }};
}

} // namespace

expected<std::vector<double>> measure_round_trip(caf::actor_system& sys, int count,
                                                 int64_t timeout_ms) {
  if (count <= 0)
    return make_error(errc::invalid_argument, "round-trip count must be positive");
  auto server = sys.spawn(echo);
  auto client = sys.spawn(prober, server, count, timeout_ms);
  caf::scoped_actor self{sys};
  expected<std::vector<double>> out = make_error(errc::timeout, "round-trip probe did not answer");
  // The whole probe is bounded: every request's timeout, plus slack.
  auto bound = std::chrono::milliseconds(timeout_ms) * 2 + std::chrono::milliseconds(count);
  self->request(client, bound, run_atom::value)
    .receive([&](std::vector<double>& us) { out = std::move(us); },
             [&](caf::error& err) { out = std::move(err); });
  self->send_exit(client, caf::exit_reason::user_shutdown);
  self->send_exit(server, caf::exit_reason::user_shutdown);
  if (out)
    std::sort(out->begin(), out->end());
  return out;
}

} // namespace troupe::actors
