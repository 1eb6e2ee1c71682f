#pragma once
// Internal to actors/rl: the RL stage's driver (rl_stage.cpp runs the
// iterations, rl_phases.cpp holds the phases). NOTE [rl iteration] in
// rl_stage.cpp.

#include "actors/rl/cast.hpp"
#include "actors/rl/environment.hpp"
#include "actors/rl/job_internal.hpp"
#include "actors/rl/reward.hpp"
#include "actors/rl/settings.hpp"
#include "actors/rl/supervision.hpp"
#include "kernels/advantages.hpp"
#include "kernels/kl.hpp"

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <utility>

namespace troupe::actors::rl::detail {

/// The algorithm's choices, made once from the config: the loop compares
/// no strings.
struct rl_algorithm {
  kernels::advantage_estimator advantage = kernels::advantage_estimator::gae;
  kernels::kl_estimator kl_estimator = kernels::kl_estimator::k1;
  /// KL as a loss term (GRPO) instead of a reward penalty (PPO).
  bool kl_in_loss = false;
  /// A frozen reference anchors the policy (kl.coef > 0 at the start).
  bool use_reference = false;
  bool adaptive_kl = false;
  bool critic = false;
  bool reward_model = false;
  /// Old log-probs from the policy's forward (else the rollout engine's).
  bool policy_old_logprobs = true;
  /// ReMax: a greedy response per prompt is generated and scored (baseline).
  bool greedy_baseline = false;

  static expected<rl_algorithm> from(const rl_config& r);
};

/// What a checkpoint holds besides the models: the iterations done, the
/// KL coefficient and (NOTE [staleness]) the batches of the next
/// iterations sampled ahead, by iteration.
struct rl_progress {
  int64_t iteration = 0;
  double beta = 0;
  std::map<int64_t, std::vector<inference::request_output>> ahead;
  /// The latest iteration that asked for its batches ahead (NOTE
  /// [staleness]): a resumed iteration that had asked does not again.
  int64_t ahead_asked = -1;
  /// With in-flight updates: the iterations whose batches the rollout
  /// held, its snapshot of them (NOTE [batches ahead]), and the rollout
  /// counters the driver had seen (NOTE [busy on replies]).
  std::vector<int64_t> in_rollout;
  std::string rollout_snapshot;
  inference::engine_metrics rollout_seen;
};

/// A batch sampled ahead (NOTE [staleness]): in the rollout until collected.
struct ahead_batch {
  /// Its request ids while the rollout holds it (NOTE [batches ahead]).
  std::vector<std::string> in_rollout;
  /// Put back from a checkpoint's snapshot: checked when collected.
  bool restored = false;
  std::vector<inference::request_output> outputs;
};

/// The batches sampled ahead fit the job resumed with them (NOTE
/// [staleness]): each for an iteration within rl.staleness of `done`, of
/// the job's batch shape, every token within the bound.
expected<void>
check_ahead_batches(const rl_config& r, int64_t done,
                    const std::map<int64_t, std::vector<inference::request_output>>& ahead);

/// NOTE [rollback] (rl_recovery.cpp): what a driver whose lost trainer
/// no DP peer can restore hands the next driver, which runs the stage again
/// from the last checkpoint (or its start) with a new cast.
struct rollback_carry {
  restart_policy restarts;
  stopwatch stage_clock;
  /// The restart the rollback serves (its restarting event, sent again as
  /// restarted once the new cast has the checkpoint's state), and when the
  /// loss was seen (stage clock seconds).
  role_id role = role_id::policy;
  job::role_changed event;
  double lost_at_s = 0;
  /// Rollbacks so far, this one included (the new cast's groups meet
  /// under a prefix of their own: NOTE [supervision]).
  int rollbacks = 0;
  /// The debug.kills already done (by index): a replayed iteration does
  /// not die again.
  std::set<size_t> kills_done;
};

/// One iteration's data, passed from phase to phase (NOTE [rl iteration]).
struct iteration_state {
  /// The iteration, from 0 (events and metrics count from 1).
  int64_t it = 0;
  std::vector<std::vector<int64_t>> prompts, responses;
  std::vector<std::vector<float>> engine_lp;
  /// The weight version that sampled each response token (NOTE [in-flight
  /// update]), and in the [B, L-1] layout (as float).
  std::vector<std::vector<int64_t>> token_version_rows;
  at::Tensor token_versions;
  std::vector<std::string> answers, metadata;
  runtime::tensor_batch batch;
  at::Tensor mask, eng_lp, old_lp, ref_lp, values, scores;
  /// A reward's dense per-token scores, in the [B, L-1] layout (undefined
  /// when it gives none), placed from token_score_rows (one per sample,
  /// response positions) once the batch is collated.
  at::Tensor token_scores;
  std::vector<std::vector<float>> token_score_rows;
  /// ReMax: each sample's greedy baseline score [B] (its prompt's).
  at::Tensor baseline_scores;
  /// NOTE [episodes]: per sample, 1 on the tokens of its response the model
  /// wrote, 0 on observations (empty without an environment); the
  /// environment's outcome reward and shaping rewards (response positions;
  /// empty = none); where the last model turn begins in the response.
  std::vector<std::vector<float>> loss_mask_rows;
  std::vector<double> env_rewards;
  std::vector<std::vector<float>> shaping_rows;
  std::vector<size_t> last_turn_begin;
  /// Scores requested during gen (NOTE [overlapped scoring]): each waits for
  /// its part's reply, in sample order.
  std::vector<std::function<expected<train::served_batch>()>> pending_scores;
  /// Mean per-sequence KL of the batch (the adaptive controller's input).
  double kl_mean = 0;
  /// β after this iteration (the adaptive controller's step; else β).
  double beta_next = 0;
  train::metric_map m;
  /// An update has begun: the models are no longer the last checkpoint's.
  bool updating = false;
  /// Cancelled after the updates began: stop (with a checkpoint) at the end.
  bool cancel_at_end = false;
  /// Seconds held (paused) inside this step, excluded from its timings.
  double held_s = 0;
};

class rl_driver {
public:
  /// `carry`: the stage runs again after a rollback (NOTE [rollback]).
  rl_driver(job_context& ctx, cast roles, rl_algorithm algo, rl_progress progress,
            std::optional<rollback_carry> carry = std::nullopt)
      : ctx_(ctx), cast_(std::move(roles)), algo_(algo), progress_(std::move(progress)),
        restarts_(carry ? std::move(carry->restarts) : restart_policy{ctx.cfg->supervision}),
        resumed_(ctx.opts->resume || carry.has_value()) {
    if (carry) {
      stage_clock_ = carry->stage_clock;
      kills_done_ = carry->kills_done;
      carry->restarts = restart_policy{supervision_config{}}; // moved into restarts_
      rolled_back_ = std::move(carry);
    }
    // A resumed run continues with the batches sampled ahead.
    for (auto& [it, outputs] : progress_.ahead)
      ahead_[it].outputs = std::move(outputs);
    progress_.ahead.clear();
  }

  /// Runs the iterations left; stops the roles at the end.
  expected<stage_summary> run();
  /// NOTE [rollback]: set when run() failed because a lost trainer rolls
  /// the stage back: what the next driver takes.
  std::optional<rollback_carry> take_rollback() { return std::exchange(rollback_, std::nullopt); }

  // The phases (rl_phases.cpp), in order.
  expected<void> gen(iteration_state& s);
  expected<void> old_log_prob(iteration_state& s);
  expected<void> ref(iteration_state& s);
  expected<void> values(iteration_state& s);
  expected<void> reward(iteration_state& s);
  expected<void> baseline(iteration_state& s);
  expected<void> adv(iteration_state& s);
  expected<void> update_critic(iteration_state& s);
  expected<void> update_actor(iteration_state& s);
  expected<void> gen_wait(iteration_state& s);
  expected<void> weight_sync(iteration_state& s);
  expected<void> evaluate(iteration_state& s);

private:
  enum class flow { go, stop };
  using phase_fn = expected<void> (rl_driver::*)(iteration_state&);

  expected<void> start();
  expected<flow> iteration(int64_t it, stage_summary& sum);
  expected<flow> run_phase(iteration_state& s, const char* phase, phase_fn fn);
  expected<flow> obey(iteration_state& s, const job::boundary_reply& orders);
  expected<void> apply_settings(int64_t it,
                                const std::vector<std::pair<std::string, std::string>>& fresh);
  expected<void> release_after(iteration_state& s, std::string_view phase);
  expected<void> save_checkpoint();
  expected<std::string> snapshot_ahead();
  std::vector<example> rows_of(int64_t it) const;
  std::vector<inference::generate_request> gen_requests(int64_t it) const;
  /// Appends one prompt's samples (output `out` of row `row`) to `s`.
  void take_samples(iteration_state& s, inference::request_output& out, const example& row) const;
  /// The reward request of samples [begin, end) of `s`.
  reward_request reward_request_of(const iteration_state& s, size_t begin, size_t end) const;
  /// gen, scoring each part as it finishes (NOTE [overlapped scoring]).
  expected<void> gen_scored(iteration_state& s);
  /// gen as episodes with the job's environment (NOTE [episodes]).
  expected<void> gen_episodes(iteration_state& s);
  /// NOTE [agent runs]: the iteration's episodes written by the job's agent.
  expected<episode_batch> agent_episodes(iteration_state& s,
                                         const std::vector<episode_prompt>& prompts,
                                         const episode_options& o);
  /// Episodes (an environment or an agent) make the batch.
  bool episodic() const { return ctx_.env || ctx_.agents; }
  /// The environment's scores applied to `s` by rl.environment.score, after
  /// the reward role's (if asked): NOTE [episodes].
  void absorb_episode_scores(iteration_state& s, bool reward_role_scored) const;
  /// The reward role's reply applied to `s` (scores, token scores, means).
  void absorb_scores(iteration_state& s, runtime::tensor_batch& reply) const;
  /// The samples' scores now: the overlapped ones collected, else asked for.
  expected<void> score_now(iteration_state& s);
  /// NOTE [dynamic sampling]: keeps the groups whose scores differ, refilled
  /// from further prompts, before the batch is collated.
  expected<void> dynamic_sampling(iteration_state& s);
  /// The requests of refill round `round` of iteration `it`.
  std::vector<inference::generate_request> refill_requests(int64_t it, int64_t round,
                                                           std::vector<example>& rows) const;
  /// NOTE [staleness]: requests the batches of iterations it+1 .. it+k not
  /// yet requested.
  expected<void> submit_ahead(int64_t it);
  /// Puts the checkpoint's snapshot of the batches ahead back into the
  /// rollout (NOTE [batches ahead]).
  expected<void> restore_ahead();
  /// Waits for the batches in flight of iterations [first, last].
  expected<void> collect_ahead(int64_t first, int64_t last);
  bool ahead_in_flight() const;
  /// The per-token staleness metrics and importance weights (NOTE
  /// [staleness]); multiplies `advantages` in place.
  void correct_stale_tokens(iteration_state& s, at::Tensor& advantages) const;
  /// Warns about the samples alone in their group (NOTE [groups of one]).
  void warn_groups_of_one(const iteration_state& s, const at::Tensor& group_ids) const;
  void inject(std::string_view phase, int64_t it);
  void role_failed(const iteration_state& s, std::string_view phase, const caf::error& err);
  /// The role an error of `phase` is about: the one it names first
  /// ("rollout: gen: ..."), else the phase's ("" when neither).
  std::string role_in_error(std::string_view phase, const caf::error& err) const;
  /// NOTE [supervision] (rl_recovery.cpp): restarts the role `loss` is
  /// about when the policy admits it, brings it to the job's state and
  /// readies `s` for `phase` to run again; else the error to fail with.
  expected<void> recover(iteration_state& s, std::string_view phase, const caf::error& loss);
  /// A restarted rollout: the version last published, the batches ahead
  /// it held asked for again (in their order), its counters kept counting.
  expected<void> restore_rollout(const iteration_state& s, std::string_view phase);
  /// Weight `version`, published already, to a restarted rollout: received
  /// again over a stored channel, sent again by the policy over a
  /// collective one (which it can while it holds that version).
  expected<void> resend_weights(int64_t version);
  /// Restarts `t`, lost (`loss`) in `phase` — directly, or as a
  /// `companion` of the role whose process it shared — and brings it to
  /// the job's state; or asks for a rollback (NOTE [rollback]).
  expected<void> restart_role(iteration_state& s, std::string_view phase, const role_traits& t,
                              const caf::error& loss, bool companion);
  /// Runs `f` — a checkpoint, an offload: `what` — again after each
  /// restart of a role it found lost (retry_lost).
  expected<flow> recovering(iteration_state& s, const char* what,
                            const std::function<expected<void>()>& f);
  /// NOTE [supervision]: while `ok` is a loss, restarts the lost role and
  /// runs `again` into `ok`; a failed restart leaves its error there. A
  /// cancel that a restart gave way to (a job waiting for a node: NOTE
  /// [replacing a worker] in cluster/job_nodes.hpp) answers stop, and with
  /// `cancel_first` so does one that came while the role was lost (a phase
  /// stops; a checkpoint a cancel asked for is still written).
  flow retry_lost(iteration_state& s, std::string_view what, expected<void>& ok,
                  const std::function<expected<void>()>& again, bool cancel_first);
  /// The restarting events of a restart of `t` admitted as `rec`.
  job::role_changed announce_restart(const role_traits& t, const restart_record& rec,
                                     const iteration_state& s, std::string_view phase);
  /// NOTE [rollback]: readies the rollback of `t`'s loss (announced by
  /// `ev`, seen at `lost_at_s`); answers the error that ends this driver.
  caf::error roll_back(const role_traits& t, job::role_changed ev, double lost_at_s);
  /// Whether a rollout lost in `phase` needs a weight version no one
  /// holds any more: sent over a collective channel (broadcast), and the
  /// policy's update has begun since (NOTE [rollback]).
  bool rollout_version_gone(std::string_view phase) const;
  /// Whether a batch generated ahead is still in the rollout.
  bool ahead_in_rollout() const;
  /// Sends the restarted event of the rollback this driver serves.
  void rolled_back();
  /// Whether a lost `t` can take its state from a surviving DP rank (ddp,
  /// two ranks or more, no model parallelism: NOTE [peer state]).
  bool peer_can_restore(const role_traits& t) const;
  /// NOTE [peer state]: the state a restarted trainer `t` starts from, as
  /// a surviving DP rank of it holds it (before the update when `phase` is
  /// its update phase).
  expected<std::string> peer_state(const role_traits& t, std::string_view phase);
  /// Drops what a failed run of `phase` left in `s`.
  void reset_phase(iteration_state& s, std::string_view phase) const;
  /// Whether the job was cancelled while `phase` ran (its other orders
  /// kept for the next iteration).
  bool cancel_pending(iteration_state& s, std::string_view phase);
  void stop_roles();
  train::engine_actor trainer(role_id role) const { return cast_.handle_as<train::engine_actor>(role); }
  inference::rollout_actor rollout() const {
    return cast_.handle_as<inference::rollout_actor>(role_id::rollout);
  }

  job_context& ctx_;
  cast cast_;
  rl_algorithm algo_;
  rl_progress progress_;
  /// Settings recorded by an earlier run of this job, not yet applied.
  std::vector<recorded_setting> replay_;
  stopwatch stage_clock_;
  /// NOTE [supervision]: which lost roles may restart, and the restarts so far.
  restart_policy restarts_;
  /// The stage resumes: from a checkpoint of an earlier run, or after a
  /// rollback (the settings recorded so far are replayed).
  bool resumed_ = false;
  /// debug.kills done so far, by index (NOTE [kill injection]).
  std::set<size_t> kills_done_;
  /// NOTE [rollback]: the one this driver serves, and the one it asks for.
  std::optional<rollback_carry> rolled_back_, rollback_;
  /// The policy's update began since its last publish: its weights are
  /// no longer the version published (resend_weights).
  bool policy_moved_ = false;
  /// Runtime settings that came with a boundary inside a phase.
  std::vector<std::pair<std::string, std::string>> deferred_settings_;
  /// The batches sampled ahead, by iteration (NOTE [staleness]); the
  /// current iteration's is kept until the iteration completes, as a
  /// checkpoint at a boundary before its updates holds it.
  std::map<int64_t, ahead_batch> ahead_;
};

} // namespace troupe::actors::rl::detail
