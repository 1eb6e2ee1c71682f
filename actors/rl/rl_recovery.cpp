// The RL driver's recovery from a lost role (NOTE [supervision] in
// supervision.hpp).

#include "actors/rl/rl_driver.hpp"
#include "runtime/weight_transport.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

namespace troupe::actors::rl::detail {

// NOTE [rollback]: a trainer whose lost rank no DP peer can restore — a
// single rank, a ZeRO shard's only owner, every rank gone — cannot be
// rebuilt in place. The driver ends instead, and the stage runs again with
// a new cast from the last checkpoint (the rl stage's start when there is
// none) as `troupe run --resume` would: its metrics past that point are
// dropped (the stage_started event), the runtime settings recorded so far
// are replayed, and the iterations since are trained again. Exact where a
// resume is (synchronous mode, fixed seeds); the replay's time is the
// price, which checkpoint_every bounds.
caf::error rl_driver::roll_back(const role_traits& t, job::role_changed ev, double lost_at_s) {
  const int n = rolled_back_ ? rolled_back_->rollbacks + 1 : 1;
  rollback_ =
      rollback_carry{restarts_, stage_clock_, t.id, std::move(ev), lost_at_s, n, kills_done_};
  const auto name = std::string{t.name};
  ctx_.log->warn(name + ": no DP rank holds its whole training state; the rl stage rolls back "
                        "to its last checkpoint and trains the iterations since again");
  return make_error(errc::lost, name + " was lost: the rl stage rolls back to its last checkpoint");
}

void rl_driver::rolled_back() {
  if (!rolled_back_)
    return;
  auto& c = *rolled_back_;
  const auto took = stage_clock_.seconds() - c.lost_at_s;
  restarts_.recovered(took);
  const auto it = progress_.iteration;
  c.event.status = "restarted";
  c.event.signal = 0;
  c.event.recover_s = took;
  c.event.reason = "rolled back to " +
                   (it > 0 ? "the checkpoint of iteration " + std::to_string(it)
                           : std::string{"the rl stage's start"}) +
                   "; the iterations since run again";
  cast_.announce(c.role, c.event);
  ctx_.log->info(std::string{traits_of(c.role).name} + " restarted in " + std::to_string(took) +
                 " s: " + c.event.reason);
  rolled_back_.reset();
}

bool rl_driver::peer_can_restore(const role_traits& t) const {
  const auto* m = cast_.member(t.id);
  return m && peer_restorable(m->spec.layout, ctx_.plan.strategy_of(std::string{t.name}));
}

expected<void> rl_driver::recover(iteration_state& s, std::string_view phase,
                                  const caf::error& loss) {
  const auto* t = find_role(role_in_error(phase, loss));
  if (!t || !cast_.has(t->id))
    return loss;
  if (auto ok = restart_role(s, phase, *t, loss, false); !ok)
    return ok;
  reset_phase(s, phase);
  // Roles that went with a process the restart started again (a worker
  // hosting several) restart now, before a checkpoint, an offload or a
  // later phase finds them gone.
  std::vector<const role_traits*> companions;
  cast_.for_each([&](const cast_member& m) {
    if (m.traits->id != t->id && ctx_.host->stale(std::string{m.traits->name}))
      companions.push_back(m.traits);
  });
  for (const auto* c : companions) {
    auto cause = make_error(errc::lost, std::string{c->name} + " ended with the process of " +
                                            std::string{t->name} + " it shared");
    if (auto ok = restart_role(s, phase, *c, cause, true); !ok)
      return ok;
  }
  return {};
}

expected<void> rl_driver::restart_role(iteration_state& s, std::string_view phase,
                                       const role_traits& t, const caf::error& loss,
                                       bool companion) {
  stopwatch clock;
  const double lost_at = stage_clock_.seconds();
  auto rec = restarts_.admit(t.id, lost_at, s.it + 1, std::string{phase}, loss);
  if (!rec)
    return rec.error();
  const auto name = std::string{t.name};
  auto ev = announce_restart(t, *rec, s, phase);
  const auto backoff = restarts_.limits(t.id).backoff_ms;
  if (backoff > 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff));
  auto failed = [&](const caf::error& e) {
    return with_prefix(e, name + " was lost (" + rec->cause + ") and its restart failed");
  };
  // NOTE [peer state]: a trainer's state comes from a surviving DP rank,
  // taken before the ranks are replaced; without one, NOTE [rollback].
  std::string state;
  // NOTE [rollback]: a rollout lost after the policy's update began, fed
  // by a channel that keeps no copy of the version it needs, cannot be
  // brought to the job's state; the stage rolls back (asynchronous modes).
  if (t.id == role_id::rollout && rollout_version_gone(phase)) {
    ctx_.log->warn("rollout: the weight version it needs went out over a collective channel "
                   "that keeps no copy, and the policy has moved on");
    return roll_back(t, std::move(ev), lost_at);
  }
  if (t.trains_in(stage_id::rl)) {
    if (peer_can_restore(t)) {
      auto got = peer_state(t, phase);
      if (got)
        state = std::move(*got);
      else
        ctx_.log->warn(describe(got.error()));
    }
    if (state.empty())
      return roll_back(t, std::move(ev), lost_at);
  }
  if (auto ok = cast_.respawn(t.id); !ok)
    return failed(ok.error());
  if (t.id == role_id::rollout)
    if (auto ok = restore_rollout(s, phase); !ok)
      return failed(ok.error());
  if (!state.empty())
    if (auto ok = ask<int64_t>(ctx_.self, cast_.handle(t.id), ctx_.timeout_of(request_kind::state),
                               name + ": load_state (a peer's)", train::load_state_atom::value,
                               std::move(state));
        !ok)
      return failed(ok.error());
  if (companion && t.id == role_id::reward)
    s.pending_scores.clear(); // asked of the lost one during gen: asked again
  const auto took = clock.seconds();
  restarts_.recovered(took);
  ev.status = "restarted";
  ev.signal = 0;
  ev.recover_s = took;
  cast_.announce(t.id, ev);
  ctx_.log->info(name + " restarted in " + std::to_string(took) + " s" +
                 (companion ? std::string{}
                            : "; iteration " + std::to_string(s.it + 1) + " runs " +
                                  std::string{phase} + " again"));
  return {};
}

// The restarting events of `t`'s ranks (the cause, the heartbeats' word,
// the attempt, the signal) and the log's line; answers the event.
job::role_changed rl_driver::announce_restart(const role_traits& t, const restart_record& rec,
                                              const iteration_state& s, std::string_view phase) {
  const auto name = std::string{t.name};
  job::role_changed ev;
  ev.status = "restarting";
  ev.reason = rec.cause;
  if (auto why = ctx_.host->loss_detail(name, 0); !why.empty())
    ev.reason += " (" + why + ")";
  ev.phase = std::string{phase};
  ev.attempt = rec.attempt;
  // The signal of the rank whose process ended (the others run on).
  if (const auto* m = cast_.member(t.id))
    for (int32_t r = 0; r < m->spec.layout.ranks() && ev.signal == 0; ++r)
      ev.signal = ctx_.host->exit_signal(name, r, r == 0 ? 500 : 100);
  cast_.announce(t.id, ev);
  ctx_.log->warn(name + " was lost in iteration " + std::to_string(s.it + 1) + ", phase " +
                 std::string{phase} + ": restarting it (attempt " + std::to_string(rec.attempt) +
                 "): " + rec.cause);
  return ev;
}

// The training state a restarted trainer starts from, as one of its
// surviving DP ranks holds it: before the update when the update phase was
// interrupted (it runs again), else as it is. The lost rank answers lost
// at once (its proxy); the first that answers with a state gives it.
expected<std::string> rl_driver::peer_state(const role_traits& t, std::string_view phase) {
  const auto* m = cast_.member(t.id);
  const auto name = std::string{t.name};
  const bool before_update = phase == t.rl_update_phase;
  caf::error why = make_error(errc::lost, name + " has no DP rank");
  for (size_t r = 0; m && r < m->ranks.size(); ++r) {
    auto got = ask<std::string>(ctx_.self, m->ranks[r], ctx_.timeout_of(request_kind::state),
                                name + " rank " + std::to_string(r) + ": peer_state",
                                train::peer_state_atom::value, before_update);
    if (got)
      return got;
    why = got.error();
  }
  return with_prefix(why, "no surviving DP rank of " + name + " could hand over its state");
}

expected<void> rl_driver::resend_weights(int64_t version) {
  auto ch = weight_channel_for(ctx_, "rl");
  if (!ch)
    return ch.error();
  if (!runtime::traits_of(ch->kind).both_ends_at_once) {
    auto got = receive_weights(ctx_.self, ctx_, "rl", rollout(), version);
    if (!got)
      return got.error();
    return {};
  }
  if (policy_moved_)
    return make_error(
        errc::unsupported,
        "rollout: receive weights: the policy's update began after it sent version " +
            std::to_string(version) + ", which a " + std::string{to_string(ch->kind)} +
            " channel keeps nowhere else (use weight_sync.transport disk or shm to restart a "
            "rollout lost then)");
  return sync_weights(ctx_.self, ctx_, "rl", trainer(role_id::policy), rollout(), version);
}

bool rl_driver::ahead_in_rollout() const {
  return std::any_of(ahead_.begin(), ahead_.end(),
                     [](const auto& a) { return !a.second.in_rollout.empty(); });
}

bool rl_driver::rollout_version_gone(std::string_view phase) const {
  auto ch = weight_channel_for(ctx_, "rl");
  const auto p = ctx_.published.find("rl");
  // (In weight_sync the phase run again sends the new version itself; with
  // no batch ahead to generate again, the next weight_sync will.)
  return ch && runtime::traits_of(ch->kind).both_ends_at_once && policy_moved_ &&
         p != ctx_.published.end() && p->second > 0 && phase != "weight_sync" && ahead_in_rollout();
}

expected<void> rl_driver::restore_rollout(const iteration_state& s, std::string_view phase) {
  // Its counters start again from zero: count on from the lost one's.
  ctx_.rollout_base = ctx_.rollout_seen;
  auto ch = weight_channel_for(ctx_, "rl");
  if (!ch)
    return ch.error();
  const bool collective = runtime::traits_of(ch->kind).both_ends_at_once;
  if (collective)
    ++ctx_.channel_generation; // the policy's group with the lost one is gone
  // The version last published; during weight_sync, the phase run again
  // sends the new one itself, and so does the next one when the policy has
  // moved on from the version a collective channel sent and no batch ahead
  // needs it (NOTE [rollback]: rollout_version_gone).
  if (auto p = ctx_.published.find("rl");
      p != ctx_.published.end() && p->second > 0 &&
      !(phase == "weight_sync" && (collective || p->second == s.it + 1)) &&
      !(collective && policy_moved_ && !ahead_in_rollout()))
    if (auto ok = resend_weights(p->second); !ok)
      return ok;
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
    s.loss_mask_rows.clear(); // NOTE [episodes]
    s.env_rewards.clear();
    s.shaping_rows.clear();
    s.last_turn_begin.clear();
    s.scores = at::Tensor{};
    s.batch = runtime::tensor_batch{};
  } else if (phase == "reward") {
    // Scores asked for during gen went to the lost reward: asked again.
    s.pending_scores.clear();
  }
}

} // namespace troupe::actors::rl::detail
