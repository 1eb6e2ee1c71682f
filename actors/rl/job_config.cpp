#include "actors/rl/job_config.hpp"

#include "actors/rl/role_traits.hpp"

#include "actors/rl/placement.hpp"
#include "actors/rl/tasks.hpp"
#include "runtime/config.hpp"
#include "runtime/file_io.hpp"

#include <algorithm>
#include <set>

namespace troupe::actors::rl {

inference::engine_config engine_settings(const job_config& cfg) {
  auto e = cfg.rl.rollout;
  e.seed = static_cast<uint64_t>(cfg.run.seed);
  const auto& r = cfg.rl;
  e.expected_sequences =
      std::max(r.prompts_per_iteration * r.samples_per_prompt * (1 + r.staleness),
               cfg.data.eval_size * r.eval_samples);
  bool task_prompts = cfg.data.train_file.empty() && cfg.data.eval_file.empty();
  auto prompt = task_prompts ? max_task_prompt_tokens(cfg.data) : 0;
  e.expected_tokens = prompt > 0 ? prompt + r.generation.max_tokens : 0;
  e.batch_invariant = e.batch_invariant || r.true_on_policy; // NOTE [true on-policy]
  return e;
}

namespace {

std::string num(double x) {
  auto s = std::to_string(x);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.')
    s.pop_back();
  return s;
}

void check_optim(const optim_config& o, const std::string& at, runtime::config_checks& checks) {
  checks.require(o.lr > 0, at + ".lr", "must be > 0, got " + num(o.lr));
  checks.require(o.weight_decay >= 0, at + ".weight_decay", "must be >= 0");
  checks.require(o.beta1 >= 0 && o.beta1 < 1, at + ".beta1", "must be in [0, 1)");
  checks.require(o.beta2 >= 0 && o.beta2 < 1, at + ".beta2", "must be in [0, 1)");
  checks.require(o.eps > 0, at + ".eps", "must be > 0");
  checks.require(o.grad_clip >= 0, at + ".grad_clip", "must be >= 0 (0 = off)");
  checks.require(o.warmup_steps >= 0, at + ".warmup_steps", "must be >= 0");
}

} // namespace

bool has_stage(const job_config& c, std::string_view name) {
  return std::find(c.stages.begin(), c.stages.end(), name) != c.stages.end();
}

kernels::advantage_estimator resolved_advantage(const rl_config& c) {
  using kernels::advantage_estimator;
  if (c.advantage)
    return *c.advantage;
  return c.algorithm == algorithm_kind::grpo ? advantage_estimator::grpo : advantage_estimator::gae;
}

kernels::policy_loss_spec actor_loss_spec(const rl_config& c, double kl_coef) {
  kernels::policy_loss_spec s;
  s.kind = c.policy_loss;
  s.options.clip_low = c.clip_ratio_low.value_or(c.clip_ratio);
  s.options.clip_high = c.clip_ratio_high.value_or(c.clip_ratio);
  s.options.dual_clip_c = c.clip_ratio_c;
  s.options.agg = c.loss_agg;
  s.options.loss_scale_factor = c.loss_scale_factor;
  s.entropy_coef = c.entropy_coef;
  s.kl_coef = kl_coef;
  s.kl = c.kl.estimator;
  return s;
}

bool kl_in_loss(const rl_config& c) {
  if (!c.kl.placement)
    return c.algorithm == algorithm_kind::grpo;
  return *c.kl.placement == kl_place::loss;
}

bool uses_critic(const rl_config& c) {
  return resolved_advantage(c) == kernels::advantage_estimator::gae;
}

bool uses_reward_model(const reward_config& c) {
  return c.kind == reward_kind::model || c.kind == reward_kind::mixed;
}

bool uses_rules(const reward_config& c) {
  return c.kind == reward_kind::rule || c.kind == reward_kind::mixed;
}

bool overlaps_scoring(const reward_config& c) {
  return c.overlap == overlap_mode::on ||
         (c.overlap == overlap_mode::automatic && c.kind == reward_kind::remote);
}

std::vector<rule_config> reward_rules(const reward_config& c) {
  if (!c.rules.empty())
    return c.rules;
  rule_config only;
  only.kind = c.rule;
  return {only};
}

int64_t max_task_prompt_tokens(const data_config& c) {
  task_options o;
  o.name = c.task;
  o.min_digits = c.min_digits;
  o.max_digits = c.max_digits;
  auto t = make_task(o);
  return t ? (*t)->max_prompt_length() + 1 : 0;
}

namespace {

// run: the directory, threads and timeouts.
void check_run(const job_config& c, runtime::config_checks& checks) {
  // run
  checks.require(!c.run.dir.empty(), "run.dir", "must not be empty");
  checks.require(c.run.threads >= 0, "run.threads", "must be >= 0 (0 = one per core)");
  const auto& t = c.run.timeouts;
  for (auto [key, value] : {std::pair{"control_s", t.control_s}, std::pair{"compute_s", t.compute_s},
                            std::pair{"generate_s", t.generate_s},
                            std::pair{"weights_s", t.weights_s}, std::pair{"state_s", t.state_s}})
    checks.require(value > 0, std::string{"run.timeouts."} + key, "must be > 0");
}

// stages: known, unique, in dependency order.
void check_stages(const job_config& c, runtime::config_checks& checks) {
  // stages: known, unique, in the stage table's order (NOTE [stage table])
  const auto names = enum_name_list<stage_id>();
  checks.require(!c.stages.empty(), "stages", "must name at least one stage");
  std::set<std::string> seen;
  int last = -1;
  for (size_t i = 0; i < c.stages.size(); ++i) {
    const auto& s = c.stages[i];
    // Located at the list (its items have no location of their own).
    const std::string at = "stages";
    auto item = "item " + std::to_string(i + 1) + ": ";
    auto id = enum_from_name<stage_id>(s);
    if (!id) {
      checks.require(false, at, item + "unknown stage '" + s + "' (stages: " + names + ")");
      continue;
    }
    checks.require(seen.insert(s).second, at, item + "stage '" + s + "' appears twice");
    int pos = static_cast<int>(*id);
    checks.require(pos > last, at,
                   item + "stage '" + s + "' must come before the stages it feeds (order: " + names + ")");
    last = std::max(last, pos);
  }
}

// data and model: sizes, head shapes, the context holding prompt + response.
void check_data_and_model(const job_config& c, runtime::config_checks& checks) {
  // data
  const auto& d = c.data;
  checks.require(d.min_digits >= 1 && d.min_digits <= 32, "data.min_digits", "must be in [1, 32]");
  checks.require(d.max_digits >= d.min_digits && d.max_digits <= 32, "data.max_digits",
                 "must be in [min_digits, 32]");
  checks.require(d.train_size >= 1, "data.train_size", "must be >= 1");
  checks.require(d.eval_size >= 1, "data.eval_size", "must be >= 1");
  checks.require(d.eval_split >= 0 && d.eval_split < 1, "data.eval_split", "must be in [0, 1)");
  checks.require(d.eval_split == 0 || (!d.train_file.empty() && d.eval_file.empty()),
                 "data.eval_split",
                 "holds rows of train_file out: needs train_file and no eval_file");
  checks.require(!d.sft_tool_calls ||
                     (d.task == task_kind::add && d.train_file.empty() && d.sft_file.empty()),
                 "data.sft_tool_calls",
                 "calls the calculator on the add task's own prompts: needs data.task add, no "
                 "train_file and no sft_file");
  checks.require(d.sft_tool_call_share >= 0 && d.sft_tool_call_share <= 1,
                 "data.sft_tool_call_share", "must be in [0, 1]");
  checks.require(d.sft_tool_calls || d.sft_tool_call_share == 1.0, "data.sft_tool_call_share",
                 "mixes the demonstrations of data.sft_tool_calls: set that too");
  for (const auto& [key, value] : {std::pair{"prompt", &d.fields.prompt},
                                   {"messages", &d.fields.messages},
                                   {"answer", &d.fields.answer},
                                   {"response", &d.fields.response},
                                   {"chosen", &d.fields.chosen},
                                   {"rejected", &d.fields.rejected},
                                   {"metadata", &d.fields.metadata}})
    checks.require(!value->empty(), std::string{"data.fields."} + key, "must name a field");

  // model
  const auto& m = c.model;
  if (m.path.empty()) {
    checks.require(m.hidden_size >= 1, "model.hidden_size", "must be >= 1");
    checks.require(m.intermediate_size >= 1, "model.intermediate_size", "must be >= 1");
    checks.require(m.num_layers >= 1, "model.num_layers", "must be >= 1");
    checks.require(m.num_heads >= 1, "model.num_heads", "must be >= 1");
    checks.require(m.num_kv_heads >= 1, "model.num_kv_heads", "must be >= 1");
    if (m.num_heads >= 1) {
      checks.require(m.hidden_size % m.num_heads == 0, "model.num_heads",
                     "hidden_size " + std::to_string(m.hidden_size) + " is not divisible by " +
                         std::to_string(m.num_heads) + " heads");
      checks.require((m.hidden_size / m.num_heads) % 2 == 0, "model.num_heads",
                     "head_dim hidden_size/num_heads must be even (rotary embeddings)");
    }
    if (m.num_kv_heads >= 1)
      checks.require(m.num_heads % m.num_kv_heads == 0, "model.num_kv_heads",
                     "num_heads " + std::to_string(m.num_heads) + " is not divisible by " +
                         std::to_string(m.num_kv_heads) + " kv heads");
    checks.require(m.rope_theta > 0, "model.rope_theta", "must be > 0");
    auto prompt = max_task_prompt_tokens(d);
    if (d.train_file.empty() && prompt > 0) {
      auto need = prompt + c.rl.generation.max_tokens;
      checks.require(m.max_position_embeddings >= need, "model.max_position_embeddings",
                     "must hold the longest " + std::string{to_string(d.task)} + " prompt (" + std::to_string(prompt) +
                         " tokens with BOS) plus " +
                         "rl.generation.max_tokens (" + std::to_string(c.rl.generation.max_tokens) +
                         "): at least " + std::to_string(need));
    }
  }
}

// sft and rm.
void check_supervised(const job_config& c, runtime::config_checks& checks) {
  // sft
  checks.require(c.sft.steps >= 1, "sft.steps", "must be >= 1");
  checks.require(c.sft.batch_size >= 1, "sft.batch_size", "must be >= 1");
  checks.require(c.sft.eval_every >= 0, "sft.eval_every", "must be >= 0");
  check_optim(c.sft.optim, "sft.optim", checks);

  // rm
  checks.require(c.rm.steps >= 1, "rm.steps", "must be >= 1");
  checks.require(c.rm.batch_size >= 1, "rm.batch_size", "must be >= 1");
  checks.require(c.rm.eval_every >= 0, "rm.eval_every", "must be >= 0");
  check_optim(c.rm.optim, "rm.optim", checks);
  if (has_stage(c, "rm"))
    checks.require(c.rm.init != model_source::sft || has_stage(c, "sft"), "rm.init",
                   "'sft' needs the sft stage in stages; use 'base' to start from the base model");

  // dpo
  const auto& d = c.dpo;
  checks.require(d.steps >= 1, "dpo.steps", "must be >= 1");
  checks.require(d.batch_size >= 1, "dpo.batch_size", "must be >= 1");
  checks.require(d.eval_every >= 0, "dpo.eval_every", "must be >= 0");
  checks.require(d.beta > 0, "dpo.beta", "must be > 0");
  checks.require(d.label_smoothing >= 0 && d.label_smoothing < 0.5, "dpo.label_smoothing",
                 "must be in [0, 0.5)");
  checks.require(d.label_smoothing == 0 || d.loss_type == kernels::dpo_loss_kind::sigmoid,
                 "dpo.label_smoothing", "applies to loss_type sigmoid only");
  check_optim(d.optim, "dpo.optim", checks);
  if (has_stage(c, "dpo"))
    checks.require(d.init != model_source::sft || has_stage(c, "sft"), "dpo.init",
                   "'sft' needs the sft stage in stages; use 'base' to start from the base model");
}

// A user service's section (rl.reward.remote, rl.environment.remote).
void check_remote(const remote_service_config& rr, const std::string& at, const std::string& what,
                  runtime::config_checks& checks) {
  checks.require(!rr.address.empty(), at + ".address", what + " needs the service's host:port");
  checks.require(rr.timeout_s > 0, at + ".timeout_s", "must be > 0");
  checks.require(rr.retries >= 0 && rr.retries <= 20, at + ".retries", "must be in [0, 20]");
  checks.require(rr.backoff_s >= 0, at + ".backoff_s", "must be >= 0");
  checks.require(rr.batch_size >= 1, at + ".batch_size", "must be >= 1");
  checks.require(rr.max_in_flight >= 1 && rr.max_in_flight <= 256, at + ".max_in_flight",
                 "must be in [1, 256]");
}

// rl: iterations, batch shape, staleness, the advantage estimator.
void check_rl_batch(const job_config& c, runtime::config_checks& checks) {
  // rl
  const auto& r = c.rl;
  checks.require(r.iterations >= 1, "rl.iterations", "must be >= 1");
  checks.require(r.prompts_per_iteration >= 1, "rl.prompts_per_iteration", "must be >= 1");
  checks.require(r.samples_per_prompt >= 1, "rl.samples_per_prompt", "must be >= 1");
  checks.require(r.epochs >= 1, "rl.epochs", "must be >= 1");
  checks.require(r.minibatches >= 1, "rl.minibatches", "must be >= 1");
  checks.require(r.staleness >= 0, "rl.staleness",
                 "must be >= 0 (0 = synchronous; k = k batches generated ahead), got " +
                     std::to_string(r.staleness));
  checks.require(r.stale_is_cap >= 1, "rl.stale_is_cap", "must be >= 1");
  checks.require(r.inflight_steps >= 0, "rl.inflight_steps",
                 "must be >= 0 (0 = until the next version arrives), got " +
                     std::to_string(r.inflight_steps));
  checks.require(r.inflight_steps == 0 || r.inflight_updates, "rl.inflight_steps",
                 "paces in-flight updates: needs rl.inflight_updates true");
  checks.require(r.inflight_steps == 0 || placement_keys(c, "rollout").tp == 1, "rl.inflight_steps",
                 "a tensor-parallel rollout steps as its group drives it: paced in-flight "
                 "updates need the rollout's tp 1");
  checks.require(r.staleness == 0 || r.old_logprobs == logprob_source::policy, "rl.old_logprobs",
                 "staleness > 0 needs the policy's old log-probs (the engine's are the stale "
                 "behaviour policy's)");
  if (r.minibatches >= 1 && r.prompts_per_iteration >= 1 && r.samples_per_prompt >= 1) {
    auto rows = r.prompts_per_iteration * r.samples_per_prompt;
    checks.require(rows % r.minibatches == 0, "rl.minibatches",
                   "the batch of " + std::to_string(rows) + " responses (prompts_per_iteration " +
                       std::to_string(r.prompts_per_iteration) + " × samples_per_prompt " +
                       std::to_string(r.samples_per_prompt) + ") is not divisible by " +
                       std::to_string(r.minibatches) + " minibatches");
  }
  using kernels::advantage_estimator;
  auto adv = resolved_advantage(r);
  if (r.dynamic_sampling.enabled) {
    checks.require(r.dynamic_sampling.max_rounds >= 0 && r.dynamic_sampling.max_rounds <= 64,
                   "rl.dynamic_sampling.max_rounds", "must be in [0, 64]");
    checks.require(r.samples_per_prompt >= 2, "rl.dynamic_sampling.enabled",
                   "compares the samples of a prompt: needs samples_per_prompt >= 2");
    checks.require(r.staleness == 0, "rl.dynamic_sampling.enabled",
                   "refills are generated by the current weights: needs rl.staleness 0");
  }
  // A group of one is allowed (NOTE [groups of one]: its raw score, with a warning).
  checks.require(adv != advantage_estimator::remax || r.staleness == 0, "rl.advantage",
                 "remax's greedy baseline is generated by the weights that score it: it needs "
                 "rl.staleness 0");
  if (r.algorithm == algorithm_kind::grpo)
    checks.require(adv != advantage_estimator::gae, "rl.advantage",
                   "grpo has no critic: gae is not available");
}

// rl: loss terms, evaluation, the critic, the reward and the KL.
void check_rl_loss_and_roles(const job_config& c, runtime::config_checks& checks) {
  const auto& r = c.rl;
  checks.require(r.clip_ratio > 0 && r.clip_ratio < 1, "rl.clip_ratio", "must be in (0, 1)");
  if (r.clip_ratio_low)
    checks.require(*r.clip_ratio_low >= 0 &&
                       (*r.clip_ratio_low < 1 || r.policy_loss == kernels::policy_loss_kind::cispo),
                   "rl.clip_ratio_low",
                   "must be in [0, 1) (cispo: >= 0, 1 or more = no floor), got " +
                       std::to_string(*r.clip_ratio_low));
  if (r.clip_ratio_high)
    checks.require(*r.clip_ratio_high >= 0, "rl.clip_ratio_high", "must be >= 0");
  if (r.clip_ratio_c)
    checks.require(*r.clip_ratio_c > 1, "rl.clip_ratio_c", "must be > 1 (null = no dual clip)");
  checks.require(r.loss_scale_factor >= 0, "rl.loss_scale_factor",
                 "must be >= 0 (0 = the batch's response columns)");
  checks.require(r.entropy_coef >= 0, "rl.entropy_coef", "must be >= 0");
  checks.require(r.gamma >= 0 && r.gamma <= 1, "rl.gamma", "must be in [0, 1]");
  checks.require(r.lam >= 0 && r.lam <= 1, "rl.lam", "must be in [0, 1]");
  checks.require(r.eval_every >= 0, "rl.eval_every", "must be >= 0");
  checks.require(r.eval_temperature >= 0, "rl.eval_temperature", "must be >= 0 (0 = greedy)");
  checks.require(r.eval_samples >= 1 && r.eval_samples <= 64, "rl.eval_samples",
                 "must be in [1, 64]");
  checks.require(r.checkpoint_every >= 0, "rl.checkpoint_every", "must be >= 0");
  check_optim(r.actor_optim, "rl.actor_optim", checks);
  if (uses_critic(r)) {
    check_optim(r.critic.optim, "rl.critic.optim", checks);
    checks.require(r.critic.value_clip >= 0, "rl.critic.value_clip", "must be >= 0 (0 = off)");
    if (has_stage(c, "rl")) {
      checks.require(r.critic.init != model_source::rm || has_stage(c, "rm"), "rl.critic.init",
                     "'rm' needs the rm stage in stages");
      checks.require(r.critic.init != model_source::sft || has_stage(c, "sft"), "rl.critic.init",
                     "'sft' needs the sft stage in stages");
    }
  }
  checks.require(r.reward.rule_weight >= 0, "rl.reward.rule_weight", "must be >= 0");
  if (r.reward.kind == reward_kind::remote)
    check_remote(r.reward.remote, "rl.reward.remote", "a remote reward", checks);
  checks.require(r.reward.rules.empty() || r.reward.rule == reward_config{}.rule, "rl.reward.rule",
                 "set either rule (the built-in tasks') or rules, not both");
  for (size_t i = 0; i < r.reward.rules.size(); ++i)
    for (auto& v : rule_violations(r.reward.rules[i], "rl.reward.rules[" + std::to_string(i) + "]",
                                   r.generation.max_tokens))
      checks.require(false, v.path, v.message);
  checks.require(r.reward.model_weight >= 0, "rl.reward.model_weight", "must be >= 0");
  if (has_stage(c, "rl") && uses_reward_model(r.reward))
    checks.require(!r.reward.model_path.empty() || has_stage(c, "rm"), "rl.reward.kind",
                   "'" + std::string{to_string(r.reward.kind)} + "' needs a reward model: add the rm stage or set " +
                       "rl.reward.model_path");
  checks.require(r.kl.coef >= 0, "rl.kl.coef", "must be >= 0");
  checks.require(r.kl.target > 0, "rl.kl.target", "must be > 0");
  checks.require(r.kl.horizon >= 1, "rl.kl.horizon", "must be >= 1");
}

// rl.environment (NOTE [episodes]): what episodes do not combine with yet.
void check_environment(const job_config& c, runtime::config_checks& checks) {
  const auto& r = c.rl;
  const auto& e = r.environment;
  if (e.kind == environment_kind::none && !r.agent.enabled())
    return;
  checks.require(e.max_turns >= 1 && e.max_turns <= 256, "rl.environment.max_turns",
                 "must be in [1, 256]");
  checks.require(e.max_context >= 0, "rl.environment.max_context",
                 "must be >= 0 (0 = the rollout's context)");
  checks.require(e.timeout_s > 0, "rl.environment.timeout_s", "must be > 0");
  checks.require(e.threads >= 0 && e.threads <= 1024, "rl.environment.threads",
                 "must be in [0, 1024]");
  if (e.kind == environment_kind::remote)
    check_remote(e.remote, "rl.environment.remote", "a remote environment", checks);
  const std::string why = "episodes with an environment are generated by the current weights, ";
  checks.require(r.staleness == 0, "rl.staleness", why + "synchronously: needs staleness 0");
  checks.require(!r.dynamic_sampling.enabled, "rl.dynamic_sampling.enabled",
                 why + "without refills: turn dynamic sampling off");
  checks.require(resolved_advantage(r) != kernels::advantage_estimator::remax, "rl.advantage",
                 why + "without ReMax's greedy baseline episodes: pick another estimator");
}

// rl.agent (NOTE [agent runs]).
void check_agent(const job_config& c, runtime::config_checks& checks) {
  const auto& a = c.rl.agent;
  if (!a.enabled())
    return;
  checks.require(!a.command.front().empty(), "rl.agent.command", "its program (argv[0]) is empty");
  checks.require(a.timeout_s > 0, "rl.agent.timeout_s", "must be > 0");
  checks.require(a.max_calls >= 0 && a.max_calls <= 4096, "rl.agent.max_calls",
                 "must be in [0, 4096] (0 = rl.environment.max_turns)");
  checks.require(a.threads >= 1 && a.threads <= 1024, "rl.agent.threads", "must be in [1, 1024]");
  checks.require(a.tls_cert_file.empty() == a.tls_key_file.empty(), "rl.agent.tls_key_file",
                 "TLS needs both tls_cert_file and tls_key_file");
}

// rl: generation and the rollout engine.
void check_rl_sampling(const job_config& c, runtime::config_checks& checks) {
  const auto& r = c.rl;
  const auto& g = r.generation;
  checks.require(g.temperature > 0, "rl.generation.temperature",
                 "must be > 0 for RL sampling (greedy responses give no exploration)");
  checks.require(g.top_k >= 0, "rl.generation.top_k", "must be >= 0 (0 = off)");
  checks.require(g.top_p > 0 && g.top_p <= 1, "rl.generation.top_p", "must be in (0, 1]");
  checks.require(g.max_tokens >= 1, "rl.generation.max_tokens", "must be >= 1");
  const auto& e = r.rollout;
  checks.require(e.block_size >= 1, "rl.rollout.block_size", "must be >= 1");
  checks.require(e.num_blocks >= 0, "rl.rollout.num_blocks", "must be >= 0 (0 = from kv_cache_mb)");
  checks.require(e.kv_cache_mb > 0, "rl.rollout.kv_cache_mb", "must be > 0");
  checks.require(e.max_num_seqs >= 1, "rl.rollout.max_num_seqs", "must be >= 1");
  checks.require(e.max_batched_tokens >= 1, "rl.rollout.max_batched_tokens", "must be >= 1");
  checks.require(e.max_model_len >= 0, "rl.rollout.max_model_len", "must be >= 0 (0 = the model's)");
}

// NOTE [true on-policy]: what would make the sampled distribution differ
// from the one the trainer scores, or split a token's reductions, is refused.
void check_true_on_policy(const job_config& c, runtime::config_checks& checks) {
  const auto& r = c.rl;
  if (!r.true_on_policy || !has_stage(c, "rl"))
    return;
  const std::string why = "true_on_policy needs ";
  checks.require(r.staleness == 0, "rl.staleness",
                 why + "every batch sampled by the weights it trains (staleness 0: the "
                       "job's only form of generating during updates)");
  checks.require(r.generation.top_k == 0, "rl.generation.top_k",
                 why + "the full distribution (top_k 0): the trainer scores untruncated "
                       "log-probs");
  checks.require(r.generation.top_p == 1, "rl.generation.top_p",
                 why + "the full distribution (top_p 1): the trainer scores untruncated "
                       "log-probs");
  for (const char* role : {"policy", "rollout"}) {
    const auto p = placement_keys(c, role);
    const auto at = std::string{"placement.roles["} + role + "]";
    checks.require(p.tp == 1, at + ".tp",
                   why + "one rank per model (tp 1): TP splits a token's reductions");
    checks.require(p.pp == 1, at + ".pp", why + "the whole model in one process (pp 1)");
    checks.require(p.strategy != dp_strategy::zero3, at + ".strategy",
                   why + "whole weights at rest (zero3 shards them)");
    checks.require(p.compute == precision::fp32, at + ".precision", why + "fp32 weights");
  }
}

// debug: fault injection names an injectable role and one of its phases.
void check_debug(const job_config& c, runtime::config_checks& checks) {
  // debug
  // The rollout's failures are covered by the rollout actor's own tests.
  const auto* failing = find_role(c.debug.fail_role);
  checks.require(c.debug.fail_role.empty() || (failing && failing->injectable), "debug.fail_role",
                 "expected one of " + role_names([](const role_traits& r) { return r.injectable; }) +
                   ", got '" + c.debug.fail_role + "'");
  checks.require(c.debug.fail_phase.empty() ||
                   (failing && std::find(failing->rl_phases.begin(), failing->rl_phases.end(),
                                         c.debug.fail_phase) != failing->rl_phases.end()),
                 "debug.fail_phase",
                 "'" + c.debug.fail_phase + "' is not a phase of role '" + c.debug.fail_role + "'");
}

// debug.kills: a role of the rl stage, a phase of the iteration, a rank it has.
void check_kills(const job_config& c, runtime::config_checks& checks) {
  for (size_t i = 0; i < c.debug.kills.size(); ++i) {
    const auto& k = c.debug.kills[i];
    const auto at = "debug.kills[" + std::to_string(i) + "]";
    const auto* role = find_role(k.role);
    checks.require(role != nullptr, at + ".role",
                   "expected one of " + role_names([](const role_traits&) { return true; }) +
                       ", got '" + k.role + "'");
    checks.require(k.phase.empty() || role_of_phase(k.phase) != nullptr ||
                       (k.phase == "checkpoint" && role && role->trains_in(stage_id::rl)),
                   at + ".phase",
                   "'" + k.phase +
                       "' is not a phase in which a role is asked for work (or checkpoint, "
                       "for a trainer)");
    checks.require(k.iteration >= 1, at + ".iteration", "must be >= 1 (iterations count from 1)");
    if (!role)
      continue;
    const auto p = placement_keys(c, k.role);
    const auto ranks = p.dp * p.tp * p.pp;
    checks.require(k.rank >= 0 && k.rank < ranks, at + ".rank",
                   "must be in [0, " + std::to_string(ranks) + ") (the ranks of " + k.role + ")");
    checks.require(k.collective == 0 || (k.collective > 0 && role->trains_in(stage_id::rl) &&
                                         p.dp >= 2 && k.phase == role->rl_update_phase),
                   at + ".collective",
                   "a kill inside a collective is for a trainer's DP rank (dp >= 2) in its "
                   "update phase (" +
                       k.role + ": dp " + std::to_string(p.dp) + ", phase '" + k.phase +
                       "'); n counts from 1");
    checks.require(k.how != kill_how::hang ||
                       (k.collective > 0 && c.placement.mode != placement_mode::in_process &&
                        c.supervision.heartbeat_s > 0),
                   at + ".how",
                   "a hang is inside a collective (collective > 0) of a rank in a worker process "
                   "(placement.mode other than in_process), found by heartbeats "
                   "(supervision.heartbeat_s > 0)");
  }
}

// supervision: known roles, once each, limits in range (NOTE [supervision]).
void check_supervision(const job_config& c, runtime::config_checks& checks) {
  const auto& s = c.supervision;
  checks.require(s.budget >= 0, "supervision.budget", "must be >= 0");
  checks.require(s.heartbeat_s == 0 || (s.heartbeat_s >= 0.01 && s.heartbeat_s <= 3600),
                 "supervision.heartbeat_s", "must be 0 (off) or in [0.01, 3600]");
  std::set<std::string> seen;
  for (size_t i = 0; i < s.roles.size(); ++i) {
    const auto& r = s.roles[i];
    const auto at = "supervision.roles[" + std::to_string(i) + "]";
    const auto* role = find_role(r.role);
    checks.require(role != nullptr, at + ".role",
                   "expected one of " + role_names([](const role_traits&) { return true; }) +
                       ", got '" + r.role + "'");
    checks.require(seen.insert(r.role).second, at + ".role", r.role + " is listed twice");
    checks.require(r.max_restarts >= -1, at + ".max_restarts", "must be >= 0 (or -1: the default)");
    checks.require(r.window_s > 0, at + ".window_s", "must be > 0");
    checks.require(r.backoff_ms >= 0 && r.backoff_ms <= 600000, at + ".backoff_ms",
                   "must be in [0, 600000]");
  }
}

} // namespace

void check(const job_config& c, runtime::config_checks& checks) {
  check_run(c, checks);
  check_stages(c, checks);
  check_data_and_model(c, checks);
  check_supervised(c, checks);
  check_rl_batch(c, checks);
  check_rl_loss_and_roles(c, checks);
  check_rl_sampling(c, checks);
  check_environment(c, checks);
  check_agent(c, checks);
  checks.require(c.weight_sync.keep >= 1 && c.weight_sync.keep <= 16, "weight_sync.keep",
                 "must be in [1, 16]");
  check_placement(c, checks);
  check_true_on_policy(c, checks);
  check_debug(c, checks);
  check_kills(c, checks);
  check_supervision(c, checks);
}

void check_job_paths(const job_config& c, runtime::config_checks& checks) {
  auto folder = [&](const std::string& key, const std::string& path) {
    if (path.empty())
      return;
    auto why = runtime::folder_unwritable_why(path);
    checks.require(why.empty(), key, "'" + path + "' " + why);
  };
  auto readable = [&](const std::string& key, const std::string& path, bool is_folder) {
    if (path.empty())
      return;
    auto why = runtime::unreadable_why(path, is_folder);
    checks.require(why.empty(), key, "'" + path + "' " + why);
  };
  folder("run.dir", c.run.dir);
  if (!c.weight_sync.transport || *c.weight_sync.transport == runtime::transport_kind::disk)
    folder("weight_sync.dir", c.weight_sync.dir);
  for (auto [key, path] : {std::pair{"data.train_file", &c.data.train_file},
                           {"data.eval_file", &c.data.eval_file},
                           {"data.sft_file", &c.data.sft_file},
                           {"data.preference_file", &c.data.preference_file}})
    readable(key, *path, false);
  readable("model.path", c.model.path, true);
  if (uses_reward_model(c.rl.reward))
    readable("rl.reward.model_path", c.rl.reward.model_path, true);
  if (c.rl.reward.kind == reward_kind::remote) {
    const auto& r = c.rl.reward.remote;
    for (auto [key, path] : {std::pair{"rl.reward.remote.token_file", &r.token_file},
                             {"rl.reward.remote.ca_file", &r.ca_file},
                             {"rl.reward.remote.cert_file", &r.cert_file},
                             {"rl.reward.remote.key_file", &r.key_file}})
      readable(key, *path, false);
  }
  if (c.rl.agent.enabled()) {
    readable("rl.agent.tls_cert_file", c.rl.agent.tls_cert_file, false);
    readable("rl.agent.tls_key_file", c.rl.agent.tls_key_file, false);
  }
}

expected<job_config> load_job(const std::string& path, const std::vector<std::string>& overrides) {
  auto doc = runtime::yaml_document::from_file(path);
  if (!doc)
    return doc.error();
  if (doc->empty())
    return make_error(errc::invalid_config,
                      path + ":1: the job file sets nothing (it is empty or holds only comments); "
                             "a job does not run from the defaults alone: start from "
                             "configs/quickstart.yaml (`troupe config show /dev/null` prints "
                             "every setting)");
  for (const auto& o : overrides)
    if (auto ok = doc->set(o); !ok)
      return ok.error();
  return runtime::load_config<job_config>(*doc, check_job_paths);
}

} // namespace troupe::actors::rl
