// The RL driver's recovery from a lost role (NOTE [supervision] in
// supervision.hpp).

#include "actors/rl/rl_driver.hpp"

#include <chrono>
#include <thread>

namespace troupe::actors::rl::detail {

expected<void> rl_driver::recover(iteration_state& s, std::string_view phase,
                                  const caf::error& loss) {
  stopwatch clock;
  const auto* t = find_role(role_in_error(phase, loss));
  if (!t || !cast_.has(t->id))
    return loss;
  auto rec = restarts_.admit(t->id, stage_clock_.seconds(), s.it + 1, std::string{phase}, loss);
  if (!rec)
    return rec.error();
  const auto name = std::string{t->name};
  job::role_changed ev;
  ev.status = "restarting";
  ev.reason = rec->cause;
  if (auto why = ctx_.host->loss_detail(name, 0); !why.empty())
    ev.reason += " (" + why + ")";
  ev.phase = std::string{phase};
  ev.attempt = rec->attempt;
  ev.signal = ctx_.host->exit_signal(name, 0, 500);
  cast_.announce(t->id, ev);
  ctx_.log->warn(name + " was lost in iteration " + std::to_string(s.it + 1) + ", phase " +
                 std::string{phase} + ": restarting it (attempt " + std::to_string(rec->attempt) +
                 "): " + rec->cause);
  const auto backoff = restarts_.limits(t->id).backoff_ms;
  if (backoff > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff));
  auto failed = [&](const caf::error& e) {
    return with_prefix(e, name + " was lost (" + rec->cause + ") and its restart failed");
  };
  if (auto ok = cast_.respawn(t->id); !ok)
    return failed(ok.error());
  if (t->id == role_id::rollout)
    if (auto ok = restore_rollout(s, phase); !ok)
      return failed(ok.error());
  reset_phase(s, phase);
  const auto took = clock.seconds();
  restarts_.recovered(took);
  ev.status = "restarted";
  ev.signal = 0;
  ev.recover_s = took;
  cast_.announce(t->id, ev);
  ctx_.log->info(name + " restarted in " + std::to_string(took) + " s; iteration " +
                 std::to_string(s.it + 1) + " runs " + std::string{phase} + " again");
  return {};
}

expected<void> rl_driver::restore_rollout(const iteration_state& s, std::string_view phase) {
  // Its counters start again from zero: count on from the lost one's.
  ctx_.rollout_base = ctx_.rollout_seen;
  // The version last published; during weight_sync, the phase run again
  // receives the new one itself.
  if (auto p = ctx_.published.find("rl"); p != ctx_.published.end() && p->second > 0 &&
                                          !(phase == "weight_sync" && p->second == s.it + 1))
    if (auto got = receive_weights(ctx_.self, ctx_, "rl", rollout(), p->second); !got)
      return got.error();
  // The batches ahead it held, as one call in their iterations' order, as
  // they were asked for (the same requests and seeds).
  std::vector<inference::generate_request> requests;
  for (const auto& [it, batch] : ahead_)
    if (!batch.in_rollout.empty())
      for (auto& q : gen_requests(it))
        requests.push_back(std::move(q));
  if (requests.empty())
    return {};
  auto queued = ask<int64_t>(ctx_.self, rollout(), ctx_.timeout_of(request_kind::generate),
                             "rollout: gen (ahead, again)", inference::generate_atom::value,
                             inference::ahead_atom::value, std::move(requests));
  if (!queued)
    return queued.error();
  return {};
}

void rl_driver::reset_phase(iteration_state& s, std::string_view phase) const {
  if (phase == "gen") {
    s.prompts.clear();
    s.responses.clear();
    s.engine_lp.clear();
    s.token_version_rows.clear();
    s.answers.clear();
    s.metadata.clear();
    s.token_score_rows.clear();
    s.pending_scores.clear();
    s.scores = at::Tensor{};
    s.batch = runtime::tensor_batch{};
  } else if (phase == "reward") {
    // Scores asked for during gen went to the lost reward: asked again.
    s.pending_scores.clear();
  }
}

} // namespace troupe::actors::rl::detail
