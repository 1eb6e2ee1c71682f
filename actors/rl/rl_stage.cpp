// The RL stage: PPO and GRPO (and the critic-free estimators RLOO,
// REINFORCE++) as one driver over the five role actors.
//
// NOTE [rl iteration]: an iteration runs these phases in order, each timed
// under timing_s/<phase> (their sum is timing_s/step):
//   gen           the rollout samples n responses per prompt (per-request
//                 seeds derived from the run seed, iteration and prompt)
//   old_log_prob  the policy's log-probs of the responses (or the engine's);
//                 rollout/logprob_diff = mean |policy − engine|
//   ref           the reference's log-probs (when kl.coef > 0)
//   values        the critic's values (gae only)
//   reward        the reward role's scores
//   adv           token rewards (score at the last token, −β·KL per token
//                 when the KL is in the reward) and advantages
//   update_critic / update_actor   epochs × minibatches inside the role
//   gen_wait      (staleness 1) waiting for the batch sampled ahead
//   weight_sync   policy weights → rollout, version = iteration
//   offload       with placement.offload: the rollout's KV pool freed after
//                 gen; a trainer's optimizer state and gradients written to
//                 <run>/rl/offload once its update is done (the critic's
//                 after update_critic, the policy's after weight_sync), read
//                 back by its next update
// Everything random is a pure function of (run.seed, iteration, index), so
// a checkpoint needs only the models, optimizer states, the KL coefficient
// and the iteration (the data position is iteration × prompts).
//
// NOTE [staleness]: with rl.staleness 1 the rollout samples iteration it+1's
// batch (same requests and seeds as synchronously) with the weights of
// iteration it, while it's batch goes through log-probs, rewards and the
// updates; the driver collects it before weight_sync, so every batch is at
// most one version old and the rollout never mixes versions. The PPO ratio
// stays relative to the current policy's log-probs; the advantages of a
// stale batch are multiplied per token by min(π_policy / π_behaviour,
// stale_is_cap) (truncated importance sampling; rollout/stale_is_weight/*).
// A run resumed from a checkpoint samples its first batch synchronously
// (the batch sampled ahead is not checkpointed), so with staleness 1 a
// resumed run is not bit-identical to an uninterrupted one.
//
// A stop request is honoured after the current phase: before the first
// update of an iteration the iteration is abandoned (nothing has changed
// since the last one) and the checkpoint holds the previous iteration's
// state; once updates have begun the iteration completes first. Either way
// a resumed run repeats exactly what an uninterrupted one does.

#include "actors/rl/job_internal.hpp"
#include "actors/rl/reward.hpp"
#include "kernels/advantages.hpp"
#include "kernels/gae.hpp"
#include "kernels/kl.hpp"
#include "kernels/losses.hpp"
#include "kernels/masked.hpp"
#include "runtime/checkpoint.hpp"
#include "runtime/torch_guard.hpp"

#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace troupe::actors::rl::detail {

namespace {

double masked_mean_of(const at::Tensor& x, const at::Tensor& mask) {
  return value_or_throw(kernels::masked_mean(x.to(torch::kFloat), mask)).item<double>();
}

// The tensors the driver computes between phases (NOTE [rl iteration]).
struct advantage_inputs {
  at::Tensor scores, old_lp, ref_lp, values, mask, group_ids;
};

struct rl_roles {
  train::engine_actor policy;
  std::optional<train::engine_actor> reference;
  std::optional<train::engine_actor> critic;
  reward_actor reward;
  inference::rollout_actor rollout;
};

// Seconds the roles have spent computing so far (handlers of the trainers and
// the reward, engine steps of the rollout).
expected<double> roles_busy(caf::blocking_actor* self, job_context& ctx, const rl_roles& roles) {
  double total = 0;
  auto add = [&](const auto& actor, const char* role) -> expected<void> {
    auto b = ask<double>(self, actor, ctx.timeout, std::string{role} + ": busy", train::busy_atom::value);
    if (!b)
      return b.error();
    total += *b;
    return {};
  };
  if (auto ok = add(roles.policy, "policy"); !ok)
    return ok.error();
  if (roles.reference)
    if (auto ok = add(*roles.reference, "reference"); !ok)
      return ok.error();
  if (roles.critic)
    if (auto ok = add(*roles.critic, "critic"); !ok)
      return ok.error();
  if (auto ok = add(roles.reward, "reward"); !ok)
    return ok.error();
  auto em = ask<inference::engine_metrics>(self, roles.rollout, ctx.timeout, "rollout: metrics",
                                           inference::metrics_atom::value);
  if (!em)
    return em.error();
  return total + em->busy_seconds;
}

struct rl_state {
  int64_t iteration = 0; ///< iterations completed
  double beta = 0;       ///< KL coefficient (adaptive controller state)
};

expected<void> save_rl_checkpoint(caf::blocking_actor* self, job_context& ctx, const rl_roles& roles,
                                  const rl_state& st) {
  runtime::checkpoint_files files;
  auto p = ask<std::string>(self, roles.policy, ctx.timeout, "policy: save state",
                            train::save_state_atom::value);
  if (!p)
    return p.error();
  files["policy.state"] = std::move(*p);
  if (roles.critic) {
    auto c = ask<std::string>(self, *roles.critic, ctx.timeout, "critic: save state",
                              train::save_state_atom::value);
    if (!c)
      return c.error();
    files["critic.state"] = std::move(*c);
  }
  nlohmann::json j = {{"stage", "rl"}, {"iteration", st.iteration}, {"kl_coef", st.beta}};
  files["driver.json"] = j.dump() + "\n";
  char name[32];
  std::snprintf(name, sizeof name, "iter_%08lld", static_cast<long long>(st.iteration));
  return runtime::write_checkpoint((ctx.run_dir / "rl" / "checkpoints").string(), name, files);
}

} // namespace

expected<stage_summary> run_rl_stage(job_context& ctx) {
  const auto& cfg = *ctx.cfg;
  const auto& r = cfg.rl;
  stopwatch clock;
  auto seed = static_cast<uint64_t>(cfg.run.seed);
  auto has = [&](const char* s) {
    return std::find(cfg.stages.begin(), cfg.stages.end(), s) != cfg.stages.end();
  };
  auto policy_dir = ctx.model_dir(has("sft") ? "sft" : "base");
  // Settings the roles will parse again, checked before any is spawned.
  if (auto rule = parse_rule_kind(r.reward.rule); !rule)
    return rule.error();
  auto estimator = kernels::parse_kl_estimator(r.kl.estimator);
  if (!estimator)
    return estimator.error();
  const auto adv_kind = resolved_advantage(r);
  const bool in_loss = kl_in_loss(r);
  const bool use_ref = r.kl.coef > 0;

  // ---- resume -------------------------------------------------------------------
  rl_state st;
  st.beta = r.kl.coef;
  std::optional<runtime::checkpoint_files> resume_files;
  std::string resume_dir;
  if (ctx.opts->resume) {
    auto dir = runtime::latest_checkpoint((ctx.run_dir / "rl" / "checkpoints").string());
    if (dir) {
      auto files = runtime::read_checkpoint(*dir);
      if (!files)
        return files.error();
      if (!files->count("policy.state") || !files->count("driver.json") ||
          (uses_critic(r) && !files->count("critic.state")))
        return make_error(errc::corrupted, *dir + ": not a checkpoint of this job's rl stage");
      auto j = nlohmann::json::parse(files->at("driver.json"), nullptr, false);
      if (j.is_discarded() || !j.contains("iteration") || !j.contains("kl_coef"))
        return make_error(errc::corrupted, *dir + ": driver.json is malformed");
      st.iteration = j["iteration"].get<int64_t>();
      st.beta = j["kl_coef"].get<double>();
      resume_files = std::move(*files);
      resume_dir = *dir;
    } else if (code_of(dir.error()) != errc::not_found) {
      return dir.error();
    }
  }
  // From iteration 0 the starting evaluation (step 0) runs again.
  if (auto ok = ctx.log.truncate(cfg.stages, "rl", st.iteration == 0 ? -1 : st.iteration); !ok)
    return ok.error();

  // ---- the cast (NOTE [role hosting] in roles.hpp) --------------------------------
  std::vector<caf::actor> spawned; // ended if building the rest fails
  auto stop_spawned = [&] {
    for (auto& a : spawned)
      caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  };
  auto policy = spawn_trainer(ctx, "rl", "policy", policy_dir);
  if (!policy)
    return policy.error();
  spawned.push_back(caf::actor_cast<caf::actor>(*policy));
  std::optional<train::engine_actor> critic, reference;
  if (uses_critic(r)) {
    auto c = spawn_trainer(ctx, "rl", "critic", ctx.model_dir(r.critic.init == "base" ? "base" : r.critic.init));
    if (!c)
      return stop_spawned(), c.error();
    critic = *c;
    spawned.push_back(caf::actor_cast<caf::actor>(*c));
  }
  if (use_ref) {
    auto c = spawn_trainer(ctx, "rl", "reference", policy_dir);
    if (!c)
      return stop_spawned(), c.error();
    reference = *c;
    spawned.push_back(caf::actor_cast<caf::actor>(*c));
  }
  auto reward = spawn_reward_role(
      ctx, uses_reward_model(r.reward)
               ? (r.reward.model_path.empty() ? ctx.model_dir("rm") : r.reward.model_path)
               : std::string{});
  if (!reward)
    return stop_spawned(), reward.error();
  spawned.push_back(caf::actor_cast<caf::actor>(*reward));
  auto rollout = spawn_rollout_role(ctx, "rl", policy_dir);
  if (!rollout)
    return stop_spawned(), rollout.error();
  rl_roles roles{*policy, reference, critic, *reward, *rollout};

  auto body = [&](caf::blocking_actor* self) -> expected<stage_summary> {
    stage_summary sum;
    sum.stage = "rl";
    sum.output = ctx.model_dir("rl");
    auto finish = [&](expected<stage_summary> res) {
      self->send_exit(roles.policy, caf::exit_reason::user_shutdown);
      self->send_exit(roles.reward, caf::exit_reason::user_shutdown);
      self->send_exit(roles.rollout, caf::exit_reason::user_shutdown);
      if (roles.reference)
        self->send_exit(*roles.reference, caf::exit_reason::user_shutdown);
      if (roles.critic)
        self->send_exit(*roles.critic, caf::exit_reason::user_shutdown);
      return res;
    };
    // Fault injection (debug.*): the named role's next request fails.
    auto inject = [&](const std::string& role, const std::string& phase, int64_t it) {
      const auto& d = cfg.debug;
      if (d.fail_role != role || it + 1 != d.fail_iteration ||
          (!d.fail_phase.empty() && d.fail_phase != phase))
        return;
      if (role == "policy")
        self->send(roles.policy, train::inject_failure_atom::value);
      else if (role == "critic" && roles.critic)
        self->send(*roles.critic, train::inject_failure_atom::value);
      else if (role == "reference" && roles.reference)
        self->send(*roles.reference, train::inject_failure_atom::value);
      else if (role == "reward")
        self->send(roles.reward, train::inject_failure_atom::value);
    };

    if (resume_files) {
      auto p = ask<int64_t>(self, roles.policy, ctx.timeout, resume_dir + ": policy: load state",
                            train::load_state_atom::value, resume_files->at("policy.state"));
      if (!p)
        return finish(p.error());
      if (roles.critic) {
        auto c = ask<int64_t>(self, *roles.critic, ctx.timeout, resume_dir + ": critic: load state",
                              train::load_state_atom::value, resume_files->at("critic.state"));
        if (!c)
          return finish(c.error());
      }
    }
    if (st.iteration > 0) {
      if (auto ok = sync_weights(self, ctx, "rl", roles.policy, roles.rollout, st.iteration); !ok)
        return finish(ok.error());
    } else {
      // The starting point's held-out score (the SFT checkpoint's).
      train::metric_map m0;
      if (auto ok = evaluate(self, ctx, roles.rollout, m0); !ok)
        return finish(ok.error());
      m0["training/global_step"] = 0;
      m0["actor/reward_kl_penalty_coeff"] = st.beta;
      if (auto ok = ctx.emit("rl", 0, r.iterations, m0, clock.seconds()); !ok)
        return finish(ok.error());
    }

    // The requests of iteration `it` (seeds from the run seed, it, prompt).
    auto gen_requests = [&](int64_t it) {
      const auto prompts_n = r.prompts_per_iteration;
      auto idx = batch_indices(static_cast<int64_t>(ctx.data.train.size()), mix_seed({seed, 51}),
                               it * prompts_n, prompts_n);
      std::vector<inference::generate_request> reqs;
      reqs.reserve(idx.size());
      for (size_t i = 0; i < idx.size(); ++i) {
        inference::generate_request q;
        q.id = std::to_string(i);
        q.prompt = encode_prompt(*ctx.tok, ctx.data.train[static_cast<size_t>(idx[i])].prompt);
        q.sampling.temperature = r.generation.temperature;
        q.sampling.top_k = r.generation.top_k;
        q.sampling.top_p = r.generation.top_p;
        q.sampling.n = static_cast<int32_t>(r.samples_per_prompt);
        q.sampling.max_tokens = r.generation.max_tokens;
        q.sampling.seed = mix_seed({seed, 52, static_cast<uint64_t>(it), i});
        reqs.push_back(std::move(q));
      }
      return reqs;
    };
    // A generation running ahead (staleness 1), and its collected outputs.
    using gen_handle = decltype(self->request(roles.rollout, ctx.timeout, inference::generate_atom::value,
                                              std::vector<inference::generate_request>{}));
    std::optional<std::pair<int64_t, gen_handle>> ahead;
    std::optional<std::pair<int64_t, expected<std::vector<inference::request_output>>>> prefetched;
    auto collect_ahead = [&] {
      if (!ahead)
        return;
      expected<std::vector<inference::request_output>> outs = make_error(errc::internal, "no reply");
      ahead->second.receive([&](std::vector<inference::request_output>& o) { outs = std::move(o); },
                            [&](caf::error& e) { outs = request_error(e, "rollout: gen (ahead)", ctx.timeout); });
      prefetched.emplace(ahead->first, std::move(outs));
      ahead.reset();
    };

    for (int64_t it = st.iteration; it < r.iterations; ++it) {
      auto busy0 = roles_busy(self, ctx, roles);
      if (!busy0)
        return finish(busy0.error());
      stopwatch step_clock;
      train::metric_map m;
      bool updating = false;
      auto stopped_before_update = [&] { return !updating && ctx.stop_requested(); };
      auto timed = [&](const char* phase, auto&& fn) {
        stopwatch t;
        auto res = fn();
        m[std::string{"timing_s/"} + phase] += t.seconds();
        return res;
      };
      auto stop_here = [&]() -> expected<stage_summary> {
        if (auto ok = save_rl_checkpoint(self, ctx, roles, st); !ok)
          return finish(ok.error());
        sum.steps = st.iteration;
        sum.stopped = true;
        return finish(sum);
      };

      // gen
      const auto prompts_n = r.prompts_per_iteration;
      const auto n = r.samples_per_prompt;
      std::vector<std::vector<int64_t>> prompts, responses;
      std::vector<std::vector<float>> engine_lp;
      std::vector<std::string> answers;
      runtime::tensor_batch batch;
      int64_t behaviour_version = it; // the weights the batch was sampled with
      auto gen = timed("gen", [&]() -> expected<void> {
        auto idx = batch_indices(static_cast<int64_t>(ctx.data.train.size()), mix_seed({seed, 51}),
                                 it * prompts_n, prompts_n);
        expected<std::vector<inference::request_output>> outs = make_error(errc::internal, "no batch");
        if (prefetched && prefetched->first == it) {
          behaviour_version = it - 1;
          outs = std::move(prefetched->second);
          prefetched.reset();
        } else {
          outs = ask<std::vector<inference::request_output>>(self, roles.rollout, ctx.timeout,
                                                             "rollout: gen", inference::generate_atom::value,
                                                             gen_requests(it));
        }
        if (!outs)
          return outs.error();
        for (size_t i = 0; i < outs->size(); ++i)
          for (auto& s : (*outs)[i].samples) {
            prompts.push_back((*outs)[i].prompt);
            responses.push_back(std::move(s.tokens));
            engine_lp.push_back(std::move(s.logprobs));
            answers.push_back(ctx.data.train[static_cast<size_t>(idx[i])].answer);
          }
        auto b = collate_sequences(prompts, responses, ctx.pad);
        if (!b)
          return b.error();
        batch = std::move(*b);
        // NOTE [staleness]: the next batch is sampled now, with these
        // weights, while this one trains; it is collected before the
        // weights change (weight_sync), so it is exactly one version old.
        if (r.staleness > 0 && it + 1 < r.iterations)
          ahead.emplace(it + 1, self->request(roles.rollout, ctx.timeout, inference::generate_atom::value,
                                              gen_requests(it + 1)));
        return {};
      });
      if (!gen)
        return finish(gen.error());
      // Co-located offload: the KV pool is not needed until the next gen
      // (unless the next gen is already running).
      if (cfg.placement.offload && !ahead) {
        auto freed = timed("offload", [&] {
          return ask<int64_t>(self, roles.rollout, ctx.timeout, "rollout: release", inference::release_atom::value);
        });
        if (!freed)
          return finish(freed.error());
        m["perf/offloaded_bytes"] += static_cast<double>(*freed);
      }
      if (stopped_before_update())
        return stop_here();

      auto step_result = guarded("rl iteration", [&]() -> expected<void> {
        auto mask = value_or_throw(batch.get("response_mask"));
        auto length = value_or_throw(batch.get("input_ids")).size(1);
        auto eng_lp = scatter_response_values(prompts, engine_lp, length);
        advantage_inputs in;
        // Co-located offload of a role once its last phase of the iteration is
        // done: a trainer's optimizer state and gradients after its update,
        // the reference's and the reward model's weights after their phase.
        auto release = [&](const auto& t, const char* what) -> expected<void> {
          if (!cfg.placement.offload)
            return {};
          auto freed = timed("offload", [&] {
            return ask<int64_t>(self, t, ctx.timeout, what, inference::release_atom::value,
                                (ctx.run_dir / "rl" / "offload").string());
          });
          if (!freed)
            return freed.error();
          m["perf/offloaded_bytes"] += static_cast<double>(*freed);
          return {};
        };
        in.mask = mask;

        // old_log_prob
        auto old = timed("old_log_prob", [&]() -> expected<void> {
          if (r.old_logprobs == "engine") {
            in.old_lp = eng_lp;
            return {};
          }
          inject("policy", "old_log_prob", it);
          auto lp = ask<runtime::tensor_batch>(self, roles.policy, ctx.timeout,
                                               "policy: old_log_prob", train::log_probs_atom::value,
                                               batch, r.generation.temperature, false);
          if (!lp)
            return lp.error();
          in.old_lp = value_or_throw(lp->get("log_probs"));
          m["rollout/logprob_diff"] = masked_mean_of((in.old_lp - eng_lp).abs(), mask);
          m["rollout/logprob_diff_max"] =
              ((in.old_lp - eng_lp).abs() * mask).max().item<double>();
          return {};
        });
        if (!old)
          return old.error();
        value_or_throw(batch.set("old_log_probs", in.old_lp));
        if (stopped_before_update())
          return make_error(errc::cancelled, "stop");

        // ref
        if (roles.reference) {
          auto ref = timed("ref", [&]() -> expected<void> {
            inject("reference", "ref", it);
            auto lp = ask<runtime::tensor_batch>(self, *roles.reference, ctx.timeout,
                                                 "reference: ref", train::log_probs_atom::value,
                                                 batch, r.generation.temperature, false);
            if (!lp)
              return lp.error();
            in.ref_lp = value_or_throw(lp->get("log_probs"));
            return {};
          });
          if (!ref)
            return ref.error();
          value_or_throw(batch.set("ref_log_probs", in.ref_lp));
          value_or_throw(release(*roles.reference, "reference: release"));
        } else {
          in.ref_lp = in.old_lp;
        }
        if (stopped_before_update())
          return make_error(errc::cancelled, "stop");

        // values
        if (roles.critic) {
          auto val = timed("values", [&]() -> expected<void> {
            inject("critic", "values", it);
            auto v = ask<runtime::tensor_batch>(self, *roles.critic, ctx.timeout, "critic: values",
                                                train::values_atom::value, batch);
            if (!v)
              return v.error();
            in.values = value_or_throw(v->get("values"));
            return {};
          });
          if (!val)
            return val.error();
          value_or_throw(batch.set("values", in.values));
        }
        if (stopped_before_update())
          return make_error(errc::cancelled, "stop");

        // reward
        auto rew = timed("reward", [&]() -> expected<void> {
          inject("reward", "reward", it);
          reward_request req;
          value_or_throw(req.batch.set("input_ids", value_or_throw(batch.get("input_ids"))));
          value_or_throw(req.batch.set("attention_mask", value_or_throw(batch.get("attention_mask"))));
          req.responses = responses;
          req.answers = answers;
          auto s = ask<runtime::tensor_batch>(self, roles.reward, ctx.timeout, "reward: score",
                                              reward_atom::value, req);
          if (!s)
            return s.error();
          in.scores = value_or_throw(s->get("scores"));
          if (s->contains("rule_scores"))
            m["critic/rule_score/mean"] = value_or_throw(s->get("rule_scores")).mean().item<double>();
          if (s->contains("model_scores"))
            m["critic/model_score/mean"] = value_or_throw(s->get("model_scores")).mean().item<double>();
          return {};
        });
        if (!rew)
          return rew.error();
        if (uses_reward_model(r.reward)) // a rule holds nothing to free
          value_or_throw(release(roles.reward, "reward: release"));
        if (stopped_before_update())
          return make_error(errc::cancelled, "stop");

        // adv
        auto adv = timed("adv", [&]() -> expected<void> {
          double beta_reward = (use_ref && !in_loss) ? st.beta : 0.0;
          auto tr = value_or_throw(kernels::token_level_rewards(in.scores, in.old_lp, in.ref_lp, mask,
                                                      beta_reward, *estimator));
          auto rows = static_cast<int64_t>(responses.size());
          auto groups = value_or_throw(kernels::contiguous_group_ids(rows, n));
          kernels::advantage_result a;
          if (adv_kind == "gae") {
            a = value_or_throw(kernels::gae(tr.rewards, in.values, mask, r.gamma, r.lam));
            // Returns stay raw (the critic's targets); advantages are whitened
            // over the batch's response tokens, so a biased young critic does
            // not push every sampled token down (or up) at once.
            if (r.whiten_advantages)
              a.advantages = value_or_throw(kernels::masked_whiten(a.advantages, mask));
          }
          else if (adv_kind == "grpo")
            a = value_or_throw(kernels::grpo_advantages(in.scores, mask, groups));
          else if (adv_kind == "rloo")
            a = value_or_throw(kernels::rloo_advantages(in.scores, mask, groups));
          else if (adv_kind == "reinforce_pp")
            a = value_or_throw(kernels::reinforce_pp_advantages(tr.rewards, mask, r.gamma));
          else
            a = value_or_throw(kernels::reinforce_pp_baseline_advantages(in.scores, mask, groups));
          if (r.staleness > 0) {
            // NOTE [staleness]: a batch sampled by the previous weights is
            // corrected per token by the importance weight π_policy /
            // π_behaviour (the policy's old log-probs over the engine's),
            // capped at stale_is_cap (truncated importance sampling).
            m["rollout/staleness"] = static_cast<double>(it - behaviour_version);
            if (behaviour_version < it) {
              auto ratio = torch::exp(in.old_lp - eng_lp);
              auto w = ratio.clamp_max(r.stale_is_cap) * mask;
              a.advantages = a.advantages * w;
              m["rollout/stale_is_weight/mean"] = masked_mean_of(w, mask);
              m["rollout/stale_is_weight/capped"] = masked_mean_of((ratio > r.stale_is_cap).to(torch::kFloat), mask);
            }
          }
          value_or_throw(batch.set("advantages", a.advantages.to(torch::kFloat)));
          value_or_throw(batch.set("returns", a.returns.to(torch::kFloat)));
          // KL of the batch: per-sequence sum, averaged (the adaptive controller's input).
          auto kl_seq = (tr.kl * mask).sum(1);
          double kl_mean = kl_seq.mean().item<double>();
          m["actor/reward_kl_penalty"] = masked_mean_of(tr.kl, mask);
          m["actor/reward_kl_penalty_coeff"] = st.beta;
          m["critic/score/mean"] = in.scores.mean().item<double>();
          m["critic/score/max"] = in.scores.max().item<double>();
          m["critic/score/min"] = in.scores.min().item<double>();
          m["critic/rewards/mean"] = (tr.rewards * mask).sum(1).mean().item<double>();
          m["critic/advantages/mean"] = masked_mean_of(a.advantages, mask);
          m["critic/advantages/max"] = (a.advantages.masked_fill(mask == 0, -1e30)).max().item<double>();
          m["critic/advantages/min"] = (a.advantages.masked_fill(mask == 0, 1e30)).min().item<double>();
          m["critic/returns/mean"] = masked_mean_of(a.returns, mask);
          if (in.values.defined())
            m["critic/values/mean"] = masked_mean_of(in.values, mask);
          m["response_length/mean"] = mask.sum(1).mean().item<double>();
          m["response_length/max"] = mask.sum(1).max().item<double>();
          if (use_ref && r.kl.controller == "adaptive") {
            double err = std::clamp(kl_mean / r.kl.target - 1.0, -0.2, 0.2);
            st.beta *= 1.0 + err * static_cast<double>(rows) / static_cast<double>(r.kl.horizon);
          }
          return expected<void>{};
        });
        if (!adv)
          return adv.error();
        if (stopped_before_update())
          return make_error(errc::cancelled, "stop");

        // update_critic, update_actor
        updating = true;
        if (roles.critic) {
          auto uc = timed("update_critic", [&]() -> expected<void> {
            inject("critic", "update_critic", it);
            train::critic_update_options o;
            o.epochs = r.epochs;
            o.minibatches = r.minibatches;
            o.value_clip = r.critic.value_clip;
            o.loss_agg = r.loss_agg;
            o.shuffle_seed = mix_seed({seed, 61, static_cast<uint64_t>(it)});
            auto res = ask<train::metric_map>(self, *roles.critic, ctx.timeout,
                                              "critic: update_critic",
                                              train::update_critic_atom::value, batch, o);
            if (!res)
              return res.error();
            m.insert(res->begin(), res->end());
            return {};
          });
          if (!uc)
            return uc.error();
          if (auto ok = release(*roles.critic, "critic: release"); !ok)
            return ok.error();
        }
        auto ua = timed("update_actor", [&]() -> expected<void> {
          inject("policy", "update_actor", it);
          train::policy_update_options o;
          o.epochs = r.epochs;
          o.minibatches = r.minibatches;
          o.clip_ratio = r.clip_ratio;
          o.entropy_coef = r.entropy_coef;
          o.temperature = r.generation.temperature;
          o.kl_loss_coef = (use_ref && in_loss) ? st.beta : 0.0;
          o.kl_estimator = r.kl.estimator;
          o.loss_agg = r.loss_agg;
          o.shuffle_seed = mix_seed({seed, 62, static_cast<uint64_t>(it)});
          auto res = ask<train::metric_map>(self, roles.policy, ctx.timeout, "policy: update_actor",
                                            train::update_policy_atom::value, batch, o);
          if (!res)
            return res.error();
          m.insert(res->begin(), res->end());
          return {};
        });
        if (!ua)
          return ua.error();
        if (ahead) {
          // The batch sampled ahead must not see the new weights.
          stopwatch t;
          collect_ahead();
          m["timing_s/gen_wait"] = t.seconds();
        }
        auto ws = timed("weight_sync", [&]() -> expected<void> {
          inject("policy", "weight_sync", it);
          return sync_weights(self, ctx, "rl", roles.policy, roles.rollout, it + 1);
        });
        if (!ws)
          return ws.error();
        // The policy's optimizer state is not needed until its next update.
        if (auto ok = release(roles.policy, "policy: release"); !ok)
          return ok.error();
        return {};
      });
      if (!step_result) {
        if (code_of(step_result.error()) == errc::cancelled && !updating)
          return stop_here();
        return finish(with_prefix(step_result.error(), "rl iteration " + std::to_string(it + 1)));
      }
      double step_s = step_clock.seconds();
      auto busy1 = roles_busy(self, ctx, roles);
      if (!busy1)
        return finish(busy1.error());
      // Time of the step not spent computing inside a role: messaging,
      // batching, scheduling, copies and the driver's own arithmetic.
      m["perf/orchestration_share"] = std::max(0.0, 1.0 - (*busy1 - *busy0) / step_s);
      st.iteration = it + 1;
      m["timing_s/step"] = step_s;
      m["training/global_step"] = static_cast<double>(it + 1);
      auto tokens = value_or_throw(batch.get("attention_mask")).sum().item<double>();
      m["perf/throughput"] = tokens / std::max(step_s, 1e-9);
      m["perf/total_num_tokens"] = tokens;

      bool last = it + 1 == r.iterations;
      if (last || (r.eval_every > 0 && (it + 1) % r.eval_every == 0)) {
        stopwatch t;
        if (auto ok = evaluate(self, ctx, roles.rollout, m); !ok)
          return finish(ok.error());
        m["timing_s/testing"] = t.seconds();
      }
      if (auto ok = ctx.emit("rl", it + 1, r.iterations, m, clock.seconds()); !ok)
        return finish(ok.error());
      sum.metrics = m;
      sum.steps = it + 1;
      bool stop = ctx.stop_requested();
      if (last || stop || (r.checkpoint_every > 0 && (it + 1) % r.checkpoint_every == 0)) {
        if (auto ok = save_rl_checkpoint(self, ctx, roles, st); !ok)
          return finish(ok.error());
      }
      if (stop && !last) {
        sum.stopped = true;
        return finish(sum);
      }
    }
    auto saved = ask<std::string>(self, roles.policy, ctx.timeout, "policy: save model",
                                  train::save_model_atom::value, sum.output);
    if (!saved)
      return finish(saved.error());
    return finish(sum);
  };
  auto res = run_driver<stage_summary>(*ctx.sys, body);
  if (res)
    res->seconds = clock.seconds();
  return res;
}

} // namespace troupe::actors::rl::detail
