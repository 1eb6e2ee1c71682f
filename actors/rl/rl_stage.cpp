// The RL stage: PPO and GRPO (and the critic-free estimators RLOO,
// REINFORCE++) as one driver over the five role actors.
//
// NOTE [rl iteration]: an iteration runs these phases in order (rl_phases.cpp),
// each a function of the iteration_state, timed under timing_s/<phase> (their
// sum is timing_s/step) and announced by phase_started / phase_finished events:
//   gen           the rollout samples n responses per prompt (per-request
//                 seeds derived from the run seed, iteration and prompt)
//   old_log_prob  the policy's log-probs of the responses (or the engine's);
//                 rollout_corr/logprob_abs_diff_mean = mean |policy − engine|
//                 (with the engine's: against the update's first minibatch,
//                 reported after update_actor)
//   ref           the reference's log-probs (when kl.coef > 0)
//   values        the critic's values (gae only)
//   reward        the reward role's scores
//   baseline      (remax) a greedy response per prompt, scored: the
//                 baseline of its samples (critic/baseline_score/mean)
//   adv           token rewards (score at the last token, −β·KL per token
//                 when the KL is in the reward) and advantages
//   update_critic / update_actor   epochs × minibatches inside the role
//   gen_wait      (staleness > 0, no in-flight updates) waiting for the
//                 batches sampled ahead
//   weight_sync   policy weights → rollout, version = iteration
//   evaluate      the held-out score, every rl.eval_every iterations
//                 (timing_s/testing)
// With placement.offload, a role's idle state is freed after its last phase
// of the iteration (timing_s/offload): the rollout's KV pool after gen, the
// reference's and a reward model's weights after theirs, a trainer's
// optimizer state and gradients after its update (the policy's after
// weight_sync), read back by their next use.
// Between phases the driver serves the job's commands (NOTE [job
// boundaries]); the boundaries before the iteration's first update are
// consistent (nothing has changed since the last iteration: a checkpoint
// there holds the previous iteration's state), those after are not, so a
// cancel there completes the iteration first. Runtime settings are applied
// at the iteration's start (NOTE [runtime settings]).
// Everything random is a pure function of (run.seed, iteration, index), so
// a checkpoint needs only the models, optimizer states, the KL coefficient
// and the iteration (the data position is iteration × prompts); a resumed
// run repeats exactly what an uninterrupted one does.
//
// NOTE [staleness]: with rl.staleness k the rollout samples the batches of
// iterations it+1 .. it+k (the same requests and seeds as synchronously)
// while it's batch goes through log-probs, rewards and the updates: each
// is requested when the batch k before it is taken, with the weights
// loaded then, so every token of the batch that trains at iteration j was
// sampled by a version ≥ j − k. Without in-flight updates the driver
// collects the batches in flight before weight_sync (gen_wait), so no
// batch mixes versions; with rl.inflight_updates the rollout loads each
// version between decode steps as it arrives (NOTE [in-flight update] in
// actors/inference/engine.hpp) and the tokens carry the versions that
// sampled them. The PPO ratio stays relative to the current policy's
// log-probs; a stale token's advantage is multiplied by min(π_policy /
// π_behaviour, stale_is_cap) with the behaviour log-prob taken when it was
// sampled (truncated importance sampling; correct_stale_tokens), and
// rollout/staleness/* report the tokens' lags. The rollout holds the
// batches ahead until the driver collects them (NOTE [batches ahead] in
// actors/inference/rollout.hpp). A checkpoint holds the batches sampled
// ahead for its next iterations: those collected in ahead_batches.bin (the
// engine's tokens, behaviour log-probs and versions); those in the rollout
// waited for first without in-flight updates, and with them its snapshot
// as they are (rollout_ahead.bin: mid-generation, with their K/V), put
// back on resume. A resumed run trains on them as the uninterrupted run
// does: without in-flight updates it is bit-identical to an uninterrupted
// one, and with them when the rollout is paced (rl.inflight_steps: NOTE
// [paced rollout]); unpaced, where a version switch falls inside a batch
// depends on timing, so two runs — resumed or not — can differ in which
// version sampled a token.
//
// NOTE [true on-policy]: with rl.true_on_policy the rollout engine runs every
// step, and the policy computes every log-prob value, through the
// batch-invariant forward (models/batch_invariant.hpp): one token's logits
// have the same bits whether the engine decodes it among a batch of others
// or the trainer scores it in a padded batch, and both take its log-prob
// with the sampler's row function. So the engine's sampled log-probs equal
// the policy's old log-probs, which equal the first minibatch's log-probs
// of the update: rollout_corr/* and actor/first_minibatch/* are exactly 0
// and that minibatch's every PPO ratio is exactly 1. The update's gradient
// still flows through the ATen forward (train_engine::set_batch_invariant).
// Refused (job_config.cpp, check_true_on_policy) with staleness > 0 —
// troupe's only way of generating while the weights change — with top-k or
// top-p truncation (the trainer scores the full distribution), and for a
// policy or rollout that is not one fp32 process per model (tp, pp, zero3,
// bf16). Bitwise holds on one instruction-set path (NOTE [batch-invariant
// kernels]): engine and trainer in one process, or on CPUs of one kind.
// Without it the contract is a bound, not an equality: docs/data-and-rewards.md.

#include "actors/rl/rl_driver.hpp"

#include "actors/rl/role_traits.hpp"
#include "runtime/binary_form.hpp"
#include "runtime/checkpoint.hpp"
#include "runtime/torch_guard.hpp"

#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <limits>
#include <set>

namespace troupe::actors::rl::detail {

expected<rl_algorithm> rl_algorithm::from(const rl_config& r) {
  rl_algorithm a;
  a.advantage = resolved_advantage(r);
  a.kl_estimator = r.kl.estimator;
  a.kl_in_loss = rl::kl_in_loss(r);
  a.use_reference = r.kl.coef > 0;
  a.adaptive_kl = r.kl.controller == kl_control::adaptive;
  a.critic = uses_critic(r);
  a.reward_model = uses_reward_model(r.reward);
  a.policy_old_logprobs = r.old_logprobs == logprob_source::policy;
  a.greedy_baseline = a.advantage == kernels::advantage_estimator::remax;
  return a;
}

namespace {

// A batch ahead for iteration `it` fits a job that has done `done`.
expected<void> check_ahead_iteration(const rl_config& r, int64_t done, int64_t it) {
  if (it < done || it > done + r.staleness)
    return make_error(errc::invalid_config,
                      "the batch sampled ahead for iteration " + std::to_string(it + 1) +
                          " is beyond rl.staleness " + std::to_string(r.staleness) +
                          " from iteration " + std::to_string(done + 1) +
                          " (was the bound lowered since the checkpoint?)");
  return {};
}

} // namespace

// A job resumed with other keys is refused, never trained on a batch it
// would not have sampled.
expected<void>
check_ahead_batches(const rl_config& r, int64_t done,
                    const std::map<int64_t, std::vector<inference::request_output>>& ahead) {
  for (const auto& [it, outs] : ahead) {
    if (auto ok = check_ahead_iteration(r, done, it); !ok)
      return ok;
    auto at = "the batch sampled ahead for iteration " + std::to_string(it + 1);
    if (static_cast<int64_t>(outs.size()) != r.prompts_per_iteration)
      return make_error(errc::invalid_config, at + " has " + std::to_string(outs.size()) +
                                                  " prompts, rl.prompts_per_iteration is " +
                                                  std::to_string(r.prompts_per_iteration));
    for (const auto& o : outs) {
      if (static_cast<int64_t>(o.samples.size()) != r.samples_per_prompt)
        return make_error(errc::invalid_config, at + " has " + std::to_string(o.samples.size()) +
                                                    " samples for request '" + o.id +
                                                    "', rl.samples_per_prompt is " +
                                                    std::to_string(r.samples_per_prompt));
      for (const auto& smp : o.samples)
        for (auto v : smp.versions)
          if (it - v > r.staleness)
            return make_error(errc::invalid_config,
                              at + " was sampled " + std::to_string(it - v) +
                                  " versions behind it, beyond rl.staleness " +
                                  std::to_string(r.staleness) +
                                  " (was the bound lowered since the checkpoint?)");
    }
  }
  return {};
}

namespace {

// The rollout engine's work during one step, from its counters before and after.
void add_rollout_metrics(train::metric_map& m, const inference::engine_metrics& a,
                         const inference::engine_metrics& b) {
  auto per = [](double x, double n) { return n > 0 ? x / n : 0.0; };
  auto generated = static_cast<double>(b.generated_tokens - a.generated_tokens);
  m["rollout/generated_tokens"] = generated;
  m["rollout/prefill_tokens"] = static_cast<double>(b.prefill_tokens_computed - a.prefill_tokens_computed);
  m["rollout/tokens_per_s"] = per(generated, b.busy_seconds - a.busy_seconds);
  m["rollout/ttft_ms"] = per(b.ttft_ms_sum - a.ttft_ms_sum,
                             static_cast<double>(b.finished_requests - a.finished_requests));
  m["rollout/itl_ms"] = per(b.itl_ms_sum - a.itl_ms_sum, static_cast<double>(b.itl_count - a.itl_count));
  m["rollout/kv_utilization"] = b.kv_peak_utilization;
  auto prompt = static_cast<double>(b.prompt_tokens - a.prompt_tokens);
  m["rollout/prefix_hit_rate"] =
    per(prompt - static_cast<double>(b.prefill_tokens_computed - a.prefill_tokens_computed), prompt);
  m["rollout/preemptions"] = static_cast<double>(b.preemptions - a.preemptions);
  m["rollout/recomputed_tokens"] = static_cast<double>(b.recomputed_tokens - a.recomputed_tokens);
  // NOTE [decode path report]: decode steps the fused CPU kernel did not run.
  m["rollout/aten_decode_steps"] = static_cast<double>(b.aten_decode_steps - a.aten_decode_steps);
}

// The latest rl checkpoint, when resuming from one.
struct rl_resume {
  rl_progress progress;
  std::optional<runtime::checkpoint_files> files;
  std::string dir;
};

// NOTE [staleness]: ahead_batches.bin, the batches sampled ahead — each
// its iteration and the engine's outputs (tokens, behaviour log-probs and
// the versions that sampled them), CAF's binary form.
struct ahead_record {
  int64_t iteration = 0;
  std::vector<inference::request_output> outputs;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, ahead_record& x) {
  return f(caf::meta::type_name("ahead_record"), x.iteration, x.outputs);
}

expected<std::string> write_ahead_batches(const std::map<int64_t, ahead_batch>& ahead) {
  std::vector<ahead_record> records;
  for (const auto& [it, batch] : ahead)
    records.push_back({it, batch.outputs});
  return runtime::to_bytes(records, "checkpoint: the batches sampled ahead");
}

expected<std::map<int64_t, std::vector<inference::request_output>>>
read_ahead_batches(const std::string& bytes) {
  std::vector<ahead_record> records;
  if (auto ok = runtime::from_bytes(bytes, records, "the batches"); !ok)
    return ok.error();
  std::map<int64_t, std::vector<inference::request_output>> out;
  for (auto& r : records)
    if (!out.emplace(r.iteration, std::move(r.outputs)).second)
      return make_error(errc::corrupted, "iteration " + std::to_string(r.iteration) + " twice");
  return out;
}

// With in-flight updates, rollout_ahead.bin: the iterations whose batches
// the rollout held, its snapshot of them (NOTE [batches ahead]) and the
// counters the driver had seen, CAF's binary form.
struct rollout_ahead_record {
  std::vector<int64_t> iterations;
  std::string snapshot;
  inference::engine_metrics seen;
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, rollout_ahead_record& x) {
  return f(caf::meta::type_name("rollout_ahead_record"), x.iterations, x.snapshot, x.seen);
}

// The checkpoint's batches in the rollout: within the bound of `done`.
expected<void> read_rollout_ahead(const rl_config& r, const std::string& bytes, rl_progress& out) {
  rollout_ahead_record rec;
  if (auto ok = runtime::from_bytes(bytes, rec, "the rollout's batches"); !ok)
    return ok;
  for (auto it : rec.iterations)
    if (auto ok = check_ahead_iteration(r, out.iteration, it); !ok)
      return ok;
  if (!r.inflight_updates)
    return make_error(errc::invalid_config,
                      "the rollout held batches ahead, generated with rl.inflight_updates; "
                      "resume with it on");
  out.in_rollout = std::move(rec.iterations);
  out.rollout_snapshot = std::move(rec.snapshot);
  out.rollout_seen = rec.seen;
  return {};
}

// The latest checkpoint when `resume` (else, or without one, the stage's start).
expected<rl_resume> find_resume(job_context& ctx, const rl_algorithm& algo, bool resume) {
  rl_resume out;
  out.progress.beta = ctx.cfg->rl.kl.coef;
  if (!resume)
    return out;
  auto dir = runtime::latest_checkpoint((ctx.run_dir / "rl" / "checkpoints").string());
  if (!dir)
    return code_of(dir.error()) == errc::not_found ? expected<rl_resume>{out}
                                                   : expected<rl_resume>{dir.error()};
  auto files = runtime::read_checkpoint(*dir);
  if (!files)
    return files.error();
  if (!has_role_state(*files, "policy") || !files->count("driver.json") ||
      (algo.critic && !has_role_state(*files, "critic")))
    return make_error(errc::corrupted, *dir + ": not a checkpoint of this job's rl stage");
  auto j = nlohmann::json::parse(files->at("driver.json"), nullptr, false);
  if (!j.is_object() || !j.contains("iteration") || !j["iteration"].is_number_integer() ||
      !j.contains("kl_coef") || !j["kl_coef"].is_number() ||
      (j.contains("ahead_asked") && !j["ahead_asked"].is_number_integer()))
    return make_error(errc::corrupted, *dir + ": driver.json is malformed");
  out.progress.iteration = j["iteration"].get<int64_t>();
  out.progress.beta = j["kl_coef"].get<double>();
  out.progress.ahead_asked = j.value("ahead_asked", out.progress.iteration - 1);
  if (files->count("ahead.bin")) // one batch, without token versions
    return make_error(errc::corrupted,
                      *dir + ": ahead.bin was written by an earlier troupe (one batch sampled "
                             "ahead, no token versions); resume it with that release, or start "
                             "the rl stage again");
  if (files->count("ahead_batches.bin")) { // NOTE [staleness]
    auto ahead = read_ahead_batches(files->at("ahead_batches.bin"));
    if (ahead)
      if (auto ok = check_ahead_batches(ctx.cfg->rl, out.progress.iteration, *ahead); !ok)
        ahead = ok.error();
    if (!ahead)
      return with_prefix(ahead.error(), *dir + ": ahead_batches.bin");
    out.progress.ahead = std::move(*ahead);
  }
  if (files->count("rollout_ahead.bin")) // NOTE [batches ahead]
    if (auto ok = read_rollout_ahead(ctx.cfg->rl, files->at("rollout_ahead.bin"), out.progress);
        !ok)
      return with_prefix(ok.error(), *dir + ": rollout_ahead.bin");
  out.files = std::move(*files);
  out.dir = *dir;
  return out;
}

// Where each role of the rl cast starts from: the policy, the reference and
// the rollout from the sft stage's model (else the base), the critic from
// rl.critic.init, a reward model from the rm stage or rl.reward.model_path
// ("" for a rule-only reward).
std::string start_dir(job_context& ctx, role_id role, const rl_algorithm& algo) {
  const auto& r = ctx.cfg->rl;
  const auto& stages = ctx.cfg->stages;
  switch (role) {
    case role_id::critic: return ctx.model_dir(std::string{to_string(r.critic.init)});
    case role_id::reward:
      return !algo.reward_model ? std::string{}
             : r.reward.model_path.empty() ? ctx.model_dir("rm")
                                           : r.reward.model_path;
    default:
      return ctx.model_dir(std::find(stages.begin(), stages.end(), "sft") != stages.end() ? "sft" : "base");
  }
}

// The cast (NOTE [the cast], NOTE [role hosting] in roles.hpp), in the
// role table's order; on failure the roles built so far are stopped (the
// cast's destructor).
// After a rollback (`carry`), the lost role's processes start again first.
expected<cast> spawn_rl_cast(job_context& ctx, const rl_algorithm& algo,
                             const rollback_carry* carry) {
  auto out = make_cast(ctx, stage_id::rl, carry ? carry->rollbacks : 0);
  if (carry)
    if (auto ok = out.revive(carry->role); !ok)
      return ok.error();
  for (auto role : stage_cast(stage_id::rl, *ctx.cfg))
    if (auto ok = out.spawn(role, start_dir(ctx, role, algo)); !ok)
      return ok.error();
  return out;
}

// The trainers' states of a checkpoint (NOTE [sharded checkpoints]).
expected<void> load_resume_state(job_context& ctx, const cast& roles, const rl_resume& res) {
  if (!res.files)
    return {};
  for (auto role : {role_id::policy, role_id::critic}) {
    if (!roles.has(role))
      continue;
    auto name = std::string{to_string(role)};
    if (auto ok = load_role_state(ctx, roles.handle_as<train::engine_actor>(role), name, *res.files,
                                  res.dir);
        !ok)
      return ok;
  }
  return {};
}

} // namespace

expected<stage_summary> run_rl_stage(job_context& ctx) {
  auto algo = rl_algorithm::from(ctx.cfg->rl);
  if (!algo)
    return algo.error();
  // NOTE [rollback]: the stage runs again from the last checkpoint while a
  // lost trainer asks for it, with the config it began with (the settings
  // recorded since are replayed at their iterations).
  const job_config initial = ctx.live;
  std::optional<rollback_carry> carry;
  for (;;) {
    auto res = find_resume(ctx, *algo, ctx.opts->resume || carry);
    if (!res)
      return res.error();
    ctx.emit(job::stage_started{"rl", ctx.cfg->rl.iterations, res->progress.iteration});
    auto roles = spawn_rl_cast(ctx, *algo, carry ? &*carry : nullptr);
    if (!roles)
      return roles.error();
    if (auto ok = load_resume_state(ctx, *roles, *res); !ok)
      return ok.error(); // the cast stops its roles
    rl_driver driver{ctx, std::move(*roles), *algo, res->progress, std::move(carry)};
    auto done = driver.run();
    carry = driver.take_rollback();
    if (done || !carry)
      return done;
    ctx.live = initial;
    ctx.published.clear();
    ++ctx.channel_generation; // a new policy and rollout: a new broadcast group
    ctx.rollout_seen = {};
    ctx.rollout_base = {};
  }
}

// ---- the driver ---------------------------------------------------------------

void rl_driver::stop_roles() {
  cast_.stop();
}

// The weights the rollout starts with, the settings of an earlier run, and
// the starting point's held-out score (the SFT model's; iteration 0 only).
expected<void> rl_driver::start() {
  auto env = job_environment(*ctx_.cfg, ctx_.opts->factories);
  if (!env)
    return env.error();
  ctx_.env = std::move(*env);
  if (ctx_.cfg->rl.agent.enabled()) {
    if (!ctx_.opts->factories.agent_endpoint)
      return make_error(errc::unsupported, "rl.agent: this process has no agent endpoint "
                                           "(run_options::factories.agent_endpoint)");
    ctx_.agents = std::make_shared<agent_book>(ctx_.enc, episode_options_of(ctx_, 0).tool_format);
  }
  auto path = (ctx_.run_dir / "settings.jsonl").string();
  if (resumed_) {
    auto rec = read_settings(path);
    if (!rec)
      return rec.error();
    replay_ = std::move(*rec);
  } else {
    std::error_code ec;
    fs::remove(path, ec);
  }
  auto& st = progress_;
  if (st.iteration > 0) {
    if (auto ok =
            sync_weights(ctx_.self, ctx_, "rl", trainer(role_id::policy), rollout(), st.iteration);
        !ok)
      return ok;
    return restore_ahead();
  }
  iteration_state s;
  s.it = -1;
  if (auto ok = evaluate(s); !ok)
    return ok;
  s.m["training/global_step"] = 0;
  s.m["data/template_divergences"] = static_cast<double>(ctx_.data.template_divergences);
  s.m["actor/reward_kl_penalty_coeff"] = st.beta;
  ctx_.metrics("rl", 0, ctx_.cfg->rl.iterations, s.m, stage_clock_.seconds());
  return {};
}

expected<stage_summary> rl_driver::run() {
  stage_summary sum;
  sum.stage = "rl";
  sum.output = ctx_.model_dir("rl");
  auto finish = [&](expected<stage_summary> r) {
    stop_roles();
    return r;
  };
  if (auto ok = start(); !ok)
    return finish(ok.error());
  rolled_back();
  sum.steps = progress_.iteration;
  for (int64_t it = progress_.iteration; it < ctx_.cfg->rl.iterations; ++it) {
    auto f = iteration(it, sum);
    if (!f)
      return finish(f.error());
    if (*f == flow::stop) {
      sum.stopped = true;
      return finish(sum);
    }
  }
  auto saved = ask<std::string>(ctx_.self, trainer(role_id::policy), ctx_.timeout_of(request_kind::state), "policy: save model",
                                train::save_model_atom::value, sum.output);
  if (!saved)
    return finish(saved.error());
  return finish(sum);
}

expected<rl_driver::flow> rl_driver::iteration(int64_t it, stage_summary& sum) {
  const auto& r = ctx_.cfg->rl;
  iteration_state s;
  s.it = it;
  auto save = [&] { return save_checkpoint(); };
  auto orders = ctx_.boundary({"rl", it + 1, "", true}, save);
  if (!orders)
    return orders.error();
  if (auto f = obey(s, *orders); !f || *f == flow::stop)
    return f;
  auto settings = std::exchange(deferred_settings_, {});
  settings.insert(settings.end(), orders->settings.begin(), orders->settings.end());
  if (auto ok = apply_settings(it, settings); !ok)
    return ok.error();
  // NOTE [busy on replies]: the roles' compute time arrives with their answers.
  const double busy0 = ctx_.roles_busy_s;
  const auto engine0 = ctx_.rollout_seen;
  stopwatch step_clock;
  struct step {
    const char* phase;
    phase_fn fn;
    bool on;
  };
  const step steps[] = {
      {"gen", &rl_driver::gen, true},
      {"old_log_prob", &rl_driver::old_log_prob, true},
      {"ref", &rl_driver::ref, algo_.use_reference},
      {"values", &rl_driver::values, algo_.critic},
      {"reward", &rl_driver::reward, true},
      {"baseline", &rl_driver::baseline, algo_.greedy_baseline},
      {"adv", &rl_driver::adv, true},
      {"update_critic", &rl_driver::update_critic, algo_.critic},
      {"update_actor", &rl_driver::update_actor, true},
      {"gen_wait", &rl_driver::gen_wait, r.staleness > 0 && !r.inflight_updates},
      {"weight_sync", &rl_driver::weight_sync, true},
  };
  for (const auto& p : steps) {
    if (!p.on)
      continue;
    auto f = run_phase(s, p.phase, p.fn);
    if (!f || *f == flow::stop)
      return f;
    if (auto f = recovering(s, "offload", [&] { return release_after(s, p.phase); });
        !f || *f == flow::stop)
      return f;
  }
  double step_s = std::max(1e-9, step_clock.seconds() - s.held_s);
  const auto& engine1 = ctx_.rollout_seen;
  double busy = ctx_.roles_busy_s - busy0 + engine1.busy_seconds - engine0.busy_seconds;
  // Time of the step not spent computing inside a role: messaging,
  // batching, scheduling, copies and the driver's own arithmetic.
  s.m["perf/orchestration_share"] = std::max(0.0, 1.0 - busy / step_s);
  add_rollout_metrics(s.m, engine0, engine1);
  s.m["timing_s/step"] = step_s;
  s.m["training/global_step"] = static_cast<double>(it + 1);
  auto attention = s.batch.get("attention_mask");
  if (!attention)
    return attention.error();
  auto tokens = attention->sum().item<double>();
  s.m["perf/throughput"] = tokens / step_s;
  s.m["perf/total_num_tokens"] = tokens;
  progress_.iteration = it + 1;
  progress_.beta = s.beta_next;
  ahead_.erase(ahead_.begin(), ahead_.lower_bound(it + 1)); // the rest are the checkpoint's
  s.updating = false; // the iteration is complete: its state is the checkpoint's
  bool last = it + 1 == r.iterations;
  if (last || (r.eval_every > 0 && (it + 1) % r.eval_every == 0)) {
    // A cancel that came while a lost rollout restarted stops here too.
    auto f = run_phase(s, "evaluate", &rl_driver::evaluate);
    if (!f || *f == flow::stop)
      return f;
  }
  ctx_.metrics("rl", it + 1, r.iterations, s.m, stage_clock_.seconds());
  sum.metrics = s.m;
  sum.steps = it + 1;
  bool stop = s.cancel_at_end;
  if (last || stop || (r.checkpoint_every > 0 && (it + 1) % r.checkpoint_every == 0)) {
    inject("checkpoint", it);
    if (auto f = recovering(s, "checkpoint", [&] { return save_checkpoint(); });
        !f || *f == flow::stop)
      return f;
  }
  return stop && !last ? flow::stop : flow::go;
}

// NOTE [supervision]: `what` between phases (a checkpoint, an offload),
// done again after each restart a lost role asks for.
expected<rl_driver::flow> rl_driver::recovering(iteration_state& s, const char* what,
                                                const std::function<expected<void>()>& f) {
  auto ok = f();
  if (retry_lost(s, what, ok, f, false) == flow::stop)
    return flow::stop;
  if (!ok)
    return ok.error();
  return flow::go;
}

rl_driver::flow rl_driver::retry_lost(iteration_state& s, std::string_view what, expected<void>& ok,
                                      const std::function<expected<void>()>& again,
                                      bool cancel_first) {
  while (!ok && code_of(ok.error()) == errc::lost) {
    if (cancel_first && cancel_pending(s, what))
      return flow::stop;
    if (auto back = recover(s, what, ok.error()); !back) {
      if (cancel_pending(s, what))
        return flow::stop;
      ok = back.error();
      break;
    }
    ok = again();
  }
  return flow::go;
}

// Runs one phase with its events and timing, then serves the boundary after it.
expected<rl_driver::flow> rl_driver::run_phase(iteration_state& s, const char* phase, phase_fn fn) {
  const auto step = s.it + 1;
  ctx_.emit(job::phase_started{"rl", step, phase});
  inject(phase, s.it);
  stopwatch t;
  auto attempt = [&] { return guarded(phase, [&] { return (this->*fn)(s); }); };
  auto ok = attempt();
  // NOTE [supervision]: a lost role restarts, and the phase runs again —
  // unless the job was cancelled meanwhile (a cancel that came while the
  // phase was stuck on a hung role that was then killed): it stops so.
  if (retry_lost(s, phase, ok, attempt, true) == flow::stop) {
    ctx_.emit(job::phase_finished{"rl", step, phase, t.seconds(), false});
    return flow::stop;
  }
  auto seconds = t.seconds();
  bool evaluating = std::string_view{phase} == "evaluate";
  s.m[std::string{"timing_s/"} + (evaluating ? "testing" : phase)] += seconds;
  ctx_.emit(job::phase_finished{"rl", step, phase, seconds, static_cast<bool>(ok)});
  if (!ok) {
    if (!rollback_) // a rollback is a restart (NOTE [rollback])
      role_failed(s, phase, ok.error());
    return with_prefix(ok.error(), "rl iteration " + std::to_string(step) + ", phase " + phase);
  }
  if (evaluating)
    return flow::go; // the next iteration's start is the next boundary
  auto orders = ctx_.boundary({"rl", step, phase, !s.updating}, [&] { return save_checkpoint(); });
  if (!orders)
    return orders.error();
  s.held_s += orders->held_s;
  return obey(s, *orders);
}

bool rl_driver::cancel_pending(iteration_state& s, std::string_view phase) {
  auto orders = ctx_.boundary({"rl", s.it + 1, std::string{phase}, false}, {});
  if (!orders)
    return false;
  s.held_s += orders->held_s;
  // Settings are applied at the next iteration's start.
  deferred_settings_.insert(deferred_settings_.end(), orders->settings.begin(),
                            orders->settings.end());
  return orders->cancel;
}

// NOTE [job boundaries]: a cancel stops here when the state is consistent
// (with a checkpoint unless --now or one was just written), else at the
// iteration's end; cancel --now stops here.
expected<rl_driver::flow> rl_driver::obey(iteration_state& s, const job::boundary_reply& orders) {
  if (!orders.cancel)
    return flow::go;
  if (orders.now)
    return flow::stop;
  if (s.updating) {
    s.cancel_at_end = true;
    return flow::go;
  }
  if (!orders.checkpoint)
    if (auto ok = save_checkpoint(); !ok)
      return ok.error();
  return flow::stop;
}

expected<void>
rl_driver::apply_settings(int64_t it,
                          const std::vector<std::pair<std::string, std::string>>& fresh) {
  auto path = (ctx_.run_dir / "settings.jsonl").string();
  auto apply = [&](const std::string& key, const std::string& value, bool state) -> expected<void> {
    auto previous = setting_value(ctx_.live, key);
    auto next = with_setting(ctx_.live, key, value);
    if (!next)
      return next.error();
    ctx_.live = std::move(*next);
    // The KL coefficient is the controller's state: a checkpoint taken after
    // the update already holds it.
    if (key == "rl.kl.coef" && state)
      progress_.beta = ctx_.live.rl.kl.coef;
    ctx_.emit(job::setting_updated{key, setting_value(ctx_.live, key), previous, it + 1});
    ctx_.log->info("setting " + key + " = " + value + " (was " + previous + ") from iteration " +
                   std::to_string(it + 1));
    return {};
  };
  // Updates an earlier run recorded, up to this iteration.
  auto due = std::stable_partition(replay_.begin(), replay_.end(),
                                   [&](const recorded_setting& x) { return x.iteration > it + 1; });
  for (auto i = due; i != replay_.end(); ++i)
    if (auto ok = apply(i->key, i->value, i->iteration > it); !ok)
      return with_prefix(ok.error(), path);
  replay_.erase(due, replay_.end());
  for (const auto& [key, value] : fresh) {
    if (auto ok = apply(key, value, true); !ok)
      return ok;
    if (auto ok = append_setting(path, {it + 1, key, value}); !ok)
      return ok;
  }
  return {};
}

expected<void> rl_driver::save_checkpoint() {
  runtime::checkpoint_files files;
  // The trained roles' states, sharded (load_resume_state reads them).
  for (auto role : {role_id::policy, role_id::critic}) {
    if (!cast_.has(role))
      continue;
    auto name = std::string{to_string(role)};
    if (auto ok = save_role_state(ctx_, trainer(role), name, name, files); !ok)
      return ok;
  }
  nlohmann::json j = {{"stage", "rl"},
                      {"iteration", progress_.iteration},
                      {"kl_coef", progress_.beta},
                      {"ahead_asked", progress_.ahead_asked}};
  files["driver.json"] = j.dump() + "\n";
  // NOTE [staleness]: the batches sampled ahead. Without in-flight updates
  // those in flight are waited for (no version loads while they run); with
  // them, the rollout's snapshot holds them as they are.
  if (ahead_in_flight() && !ctx_.cfg->rl.inflight_updates)
    if (auto ok = collect_ahead(progress_.iteration, std::numeric_limits<int64_t>::max()); !ok)
      return ok;
  if (ahead_in_flight()) {
    auto bytes = snapshot_ahead();
    if (!bytes)
      return bytes.error();
    files["rollout_ahead.bin"] = std::move(*bytes);
  }
  std::map<int64_t, ahead_batch> collected;
  for (const auto& [it, batch] : ahead_)
    if (batch.in_rollout.empty())
      collected.emplace(it, batch);
  if (!collected.empty()) {
    auto bytes = write_ahead_batches(collected);
    if (!bytes)
      return bytes.error();
    files["ahead_batches.bin"] = std::move(*bytes);
  }
  return commit_checkpoint(ctx_, "rl", progress_.iteration, "iter", files);
}

// NOTE [batches ahead]: the rollout's snapshot of the batches it holds
// (with a pace, taken once it stops stepping: NOTE [paced rollout]).
expected<std::string> rl_driver::snapshot_ahead() {
  rollout_ahead_record rec;
  for (const auto& [it, batch] : ahead_)
    if (!batch.in_rollout.empty())
      rec.iterations.push_back(it);
  auto snap = ask<std::string>(ctx_.self, rollout(), ctx_.timeout_of(request_kind::generate),
                               "rollout: snapshot", inference::snapshot_atom::value);
  if (!snap)
    return snap.error();
  rec.snapshot = std::move(*snap);
  rec.seen = ctx_.rollout_seen;
  return runtime::to_bytes(rec, "checkpoint: the rollout's batches ahead");
}

expected<void> rl_driver::restore_ahead() {
  auto& st = progress_;
  if (st.in_rollout.empty())
    return {};
  auto ids = ask<std::vector<std::string>>(
      ctx_.self, rollout(), ctx_.timeout_of(request_kind::generate), "rollout: restore",
      inference::restore_atom::value, std::exchange(st.rollout_snapshot, {}));
  if (!ids)
    return ids.error();
  std::set<std::string> held(ids->begin(), ids->end()), expected_ids;
  for (auto it : st.in_rollout) {
    auto& batch = ahead_[it];
    for (const auto& q : gen_requests(it)) {
      batch.in_rollout.push_back(q.id);
      expected_ids.insert(q.id);
    }
    batch.restored = true;
  }
  if (held != expected_ids)
    return make_error(errc::corrupted,
                      "rollout_ahead.bin: the rollout's snapshot holds " +
                          std::to_string(held.size()) + " requests, not the " +
                          std::to_string(expected_ids.size()) +
                          " of the batches ahead it names (was the data or the batch shape "
                          "changed since the checkpoint?)");
  ctx_.rollout_seen = st.rollout_seen;
  st.in_rollout.clear();
  return {};
}

// Fault injection (debug.*): the role of `phase` fails its next request;
// the kills of this iteration and phase (the first phase, gen, for a kill
// without one) arm their ranks (NOTE [kill injection]).
void rl_driver::inject(std::string_view phase, int64_t it) {
  const auto& d = ctx_.cfg->debug;
  for (size_t i = 0; i < d.kills.size(); ++i) {
    const auto& k = d.kills[i];
    if (k.iteration == it + 1 && (k.phase.empty() ? phase == "gen" : k.phase == phase))
      if (const auto* t = find_role(k.role); t && kills_done_.insert(i).second)
        cast_.kill(t->id, static_cast<int>(k.rank), k.collective, k.how == kill_how::hang);
  }
  const auto* t = role_of_phase(phase);
  if (d.fail_role.empty() || it + 1 != d.fail_iteration ||
      (!d.fail_phase.empty() && d.fail_phase != phase) || !t || t->name != d.fail_role)
    return;
  cast_.inject(t->id);
}

std::string rl_driver::role_in_error(std::string_view phase, const caf::error& err) const {
  auto text = context_of(err);
  const auto* phase_role = role_of_phase(phase);
  std::string role{phase_role ? phase_role->name : std::string_view{}};
  for (const auto& t : all_roles())
    if (text.rfind(std::string{t.name} + ":", 0) == 0)
      role = t.name;
  return role;
}

// The role-failed event of a phase's error (the role it is about).
void rl_driver::role_failed(const iteration_state& s, std::string_view phase,
                            const caf::error& err) {
  auto role = role_in_error(phase, err);
  if (role.empty())
    return;
  auto place = ctx_.host->where(role, 0);
  auto code = code_of(err);
  int signal = code == errc::lost || code == errc::unavailable || code == errc::process_failed
                   ? ctx_.host->exit_signal(role, 0, 2000)
                   : 0;
  ctx_.emit(job::role_changed{"rl", role, 0, place.process, place.pid, "failed", describe(err),
                              signal, std::string{phase}, place.node});
}

} // namespace troupe::actors::rl::detail
