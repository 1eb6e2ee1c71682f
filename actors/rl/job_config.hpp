#pragma once
// The job spec of `troupe run`: one YAML file → these structs (NOTE [config
// visitors] in runtime/config.hpp). Every key has a default; configs/
// reference.yaml is this file's visitors printed with their comments (a
// test keeps the two in sync).
//
// A job runs `stages` in order; each starts from the previous one's output:
//   sft  trains the base model on demonstrations      → <run>/sft/model
//   rm   trains a reward model on preference pairs     → <run>/rm/model
//   rl   PPO / GRPO with the five roles (policy, critic, reward, reference,
//        rollout) as actors                            → <run>/rl/model

#include "actors/inference/engine.hpp"
#include "actors/rl/datasets.hpp"
#include "actors/rl/environment.hpp"
#include "actors/rl/job_choices.hpp"
#include "actors/rl/tasks.hpp"
#include "actors/rl/verifiers.hpp"
#include "actors/train/optimizer_options.hpp"
#include "kernels/advantages.hpp"
#include "kernels/kl.hpp"
#include "kernels/losses.hpp"
#include "kernels/masked.hpp"
#include "kernels/preference.hpp"
#include "models/tool_calls.hpp"
#include "runtime/config.hpp"
#include "runtime/logging.hpp"
#include "runtime/weight_transport.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace troupe::actors::rl {

/// How long the driver waits for a role's answer, by kind of request; every
/// request has one of these bounds.
struct timeouts_config {
  /// Counters, metrics, caches, freeing a KV pool.
  double control_s = 60;
  /// Log-probs, values, scores, updates, SFT / RM steps (and DP collectives).
  double compute_s = 600;
  /// Generation and evaluation.
  double generate_s = 1800;
  /// Publishing and receiving weights.
  double weights_s = 600;
  /// Saving and loading training state and models, offload files.
  double state_s = 600;
};
template <class V>
void visit(V& v, timeouts_config& c) {
  v.field("control_s", c.control_s, "Counters, metrics, caches, freeing a KV pool");
  v.field("compute_s", c.compute_s, "Log-probs, values, scores, updates, SFT / RM steps");
  v.field("generate_s", c.generate_s, "Generation and evaluation");
  v.field("weights_s", c.weights_s, "Publishing and receiving weights");
  v.field("state_s", c.state_s, "Saving and loading training state and models, offload files");
}

struct run_config {
  std::string name = "troupe";
  /// Run directory (metrics.jsonl, stage outputs, checkpoints); relative
  /// paths are relative to the working directory.
  std::string dir = "runs/troupe";
  int64_t seed = 1;
  /// Compute threads (LibTorch intra-op); 0 = one per core.
  int64_t threads = 0;
  /// Longest waits for requests to the roles.
  timeouts_config timeouts;
  /// Terminal output: auto (a bar on a terminal, lines otherwise), bar,
  /// lines, none.
  progress_style progress = progress_style::automatic;
  /// Lowest level of <run dir>/troupe.log and the job's log events.
  runtime::log_level log_level = runtime::log_level::info;
};
template <class V>
void visit(V& v, run_config& c) {
  v.field("name", c.name, "Run name (shown in logs and metrics)");
  v.field("dir", c.dir, "Run directory: metrics.jsonl, stage outputs, checkpoints");
  v.field("seed", c.seed, "Seed of every random choice (data order, init, sampling)");
  v.field("threads", c.threads, "Compute threads; 0 = one per core");
  v.section("timeouts", c.timeouts, "Longest wait for a role's answer, seconds, by request kind");
  v.choice("progress", c.progress,
           "Terminal output: auto = a bar on a terminal, one line per iteration otherwise");
  v.choice("log_level", c.log_level,
           "Lowest level written to <run dir>/troupe.log and the job's event stream");
}

/// Where prompts and data come from: a built-in task, or JSONL / JSON files
/// (NOTE [dataset files] in datasets.hpp).
struct data_config {
  /// Built-in task; JSONL files below replace its splits.
  task_kind task = task_kind::sort;
  int64_t min_digits = 3;
  int64_t max_digits = 6;
  int64_t seed = 1234;
  int64_t train_size = 4000;
  int64_t eval_size = 200;
  /// JSONL {prompt, answer}: RL prompts / held-out evaluation ("" = task).
  std::string train_file;
  std::string eval_file;
  /// JSONL {prompt, response}: SFT demonstrations ("" = the task's answers).
  std::string sft_file;
  /// Without an sft_file: the task's demonstrations call the calculator
  /// tool (multi-turn, NOTE [demonstration turns]; the add task).
  bool sft_tool_calls = false;
  /// With sft_tool_calls: the share of demonstrations that call the tool;
  /// the others (drawn by `seed`) answer at once, the tool still offered.
  double sft_tool_call_share = 1.0;
  /// JSONL {prompt, chosen, rejected} ("" = answers vs. wrong answers).
  std::string preference_file;
  /// Without an eval_file: the share of train_file's rows held out (by
  /// `seed`) for evaluation; 0 = the task's held-out set.
  double eval_split = 0.0;
  /// The files' field names (NOTE [dataset files]).
  dataset_fields fields;
  /// Plain prompts go through the model's chat template too, as one user
  /// message (conversations always do; NOTE [prompt encoding]).
  bool chat_template = false;
  /// NOTE [prefix check]: conversations would be rendered and tokenised
  /// again at each turn instead of extended by token ids; a chat template
  /// that is not append-only is then refused.
  bool retokenize = false;
};
template <class V>
void visit(V& v, data_config& c) {
  v.choice("task", c.task, "Built-in task: sort (digit sorting) or add (addition)");
  v.field("min_digits", c.min_digits, "Fewest digits per number");
  v.field("max_digits", c.max_digits, "Most digits per number");
  v.field("seed", c.seed, "Seed of the generated examples");
  v.field("train_size", c.train_size, "Generated training examples");
  v.field("eval_size", c.eval_size, "Generated held-out examples (disjoint from training)");
  v.field("train_file", c.train_file, "JSONL {prompt, answer} for RL prompts; \"\" = the task");
  v.field("eval_file", c.eval_file, "JSONL {prompt, answer} held-out set; \"\" = the task");
  v.field("sft_file", c.sft_file, "JSONL {prompt, response} for SFT; \"\" = the task's answers");
  v.field("sft_tool_calls", c.sft_tool_calls,
          "Without sft_file: the add task's demonstrations call the calculator tool, read its "
          "result and answer (multi-turn; loss on the model's turns only)");
  v.field("sft_tool_call_share", c.sft_tool_call_share,
          "With sft_tool_calls: the share of demonstrations that call the tool; the others "
          "(drawn by seed) answer at once, with the tool offered");
  v.field("preference_file", c.preference_file,
          "JSONL {prompt, chosen, rejected} for RM; \"\" = answers vs. wrong answers");
  v.field("eval_split", c.eval_split,
          "Without eval_file: the share of train_file's rows held out (by seed) for evaluation; "
          "0 = the task's held-out set");
  v.section("fields", c.fields,
            "Field names of the files' rows (a dotted key reads a nested field)");
  v.field("chat_template", c.chat_template,
          "Render plain prompts as one user message through the model's chat template "
          "(conversations always are)");
  v.field("retokenize", c.retokenize,
          "Re-render and re-tokenise conversations at each turn instead of extending token "
          "ids: refuses a chat template that is not append-only (docs/data-and-rewards.md)");
}

/// The base model: a fresh random decoder of this shape, or a checkpoint.
struct model_config {
  /// "" = random init with the shape below; else a HF-format directory.
  std::string path;
  int64_t hidden_size = 128;
  int64_t intermediate_size = 384;
  int64_t num_layers = 4;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 4;
  int64_t max_position_embeddings = 64;
  double rope_theta = 10000;
};
template <class V>
void visit(V& v, model_config& c) {
  v.field("path", c.path, "HF-format model directory; \"\" = random init with the shape below");
  v.field("hidden_size", c.hidden_size);
  v.field("intermediate_size", c.intermediate_size);
  v.field("num_layers", c.num_layers);
  v.field("num_heads", c.num_heads);
  v.field("num_kv_heads", c.num_kv_heads, "Key/value heads (grouped-query attention)");
  v.field("max_position_embeddings", c.max_position_embeddings, "Context length in tokens");
  v.field("rope_theta", c.rope_theta);
}

using optim_config = train::optimizer_options;

struct sft_config {
  int64_t steps = 300;
  int64_t batch_size = 32;
  optim_config optim;
  /// Held-out evaluation (greedy score) every N steps; 0 = only at the end.
  int64_t eval_every = 100;
};
template <class V>
void visit(V& v, sft_config& c) {
  v.field("steps", c.steps, "Optimizer steps");
  v.field("batch_size", c.batch_size, "Demonstrations per step");
  v.section("optim", c.optim);
  v.field("eval_every", c.eval_every, "Held-out score every N steps; 0 = at the end only");
}

struct rm_config {
  int64_t steps = 200;
  int64_t batch_size = 32;
  optim_config optim;
  /// Initial weights: the sft stage's model or the base model.
  model_source init = model_source::sft;
  /// Held-out pairwise accuracy every N steps; 0 = only at the end.
  int64_t eval_every = 100;
};
template <class V>
void visit(V& v, rm_config& c) {
  v.field("steps", c.steps, "Optimizer steps");
  v.field("batch_size", c.batch_size, "Preference pairs per step");
  v.section("optim", c.optim);
  v.choice("init", c.init, {model_source::sft, model_source::base},
           "Start from the sft stage's model or the base model");
  v.field("eval_every", c.eval_every, "Held-out pairwise accuracy every N steps; 0 = at the end");
}

/// Direct preference optimisation (NOTE [dpo stage] in actors/rl/dpo_stage.cpp).
struct dpo_config {
  int64_t steps = 200;
  int64_t batch_size = 16;
  optim_config optim;
  /// The policy and the reference start from the sft stage's model or the base model.
  model_source init = model_source::sft;
  /// β: the strength of the implicit KL to the reference.
  double beta = 0.1;
  /// sigmoid (DPO), hinge (SLiC), ipo (IPO, on length-averaged log-probs).
  kernels::dpo_loss_kind loss_type = kernels::dpo_loss_kind::sigmoid;
  /// The probability a pair's label is wrong (sigmoid: conservative DPO).
  double label_smoothing = 0;
  /// Held-out pairwise metrics every N steps; 0 = only at the end.
  int64_t eval_every = 50;
};
template <class V>
void visit(V& v, dpo_config& c) {
  v.field("steps", c.steps, "Optimizer steps");
  v.field("batch_size", c.batch_size, "Preference pairs per step");
  v.section("optim", c.optim);
  v.choice("init", c.init, {model_source::sft, model_source::base},
           "The policy and the reference start from the sft stage's model or the base model");
  v.field("beta", c.beta, "β > 0: the implicit KL strength");
  v.choice("loss_type", c.loss_type,
           "sigmoid (DPO), hinge (SLiC), ipo (IPO: length-averaged log-probs) — TRL's names");
  v.field("label_smoothing", c.label_smoothing,
          "sigmoid: probability in [0, 0.5) that a pair's label is flipped (cDPO)");
  v.field("eval_every", c.eval_every,
          "Held-out pairwise metrics (val/rewards/*) every N steps; 0 = at the end");
}

struct generation_config {
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  int64_t max_tokens = 16;
};
template <class V>
void visit(V& v, generation_config& c) {
  v.field("temperature", c.temperature, "0 = greedy");
  v.field("top_k", c.top_k, "0 = off");
  v.field("top_p", c.top_p, "1 = off");
  v.field("max_tokens", c.max_tokens, "Generated tokens per response at most");
}

struct kl_config {
  /// β: in the reward (PPO) or the loss coefficient (use_kl_loss).
  double coef = 0.05;
  kernels::kl_estimator estimator = kernels::kl_estimator::k1;
  /// fixed | adaptive (Ziegler et al.: β follows the KL towards `target`).
  kl_control controller = kl_control::fixed;
  double target = 6.0;
  int64_t horizon = 10000;
  /// KL as a loss term (GRPO) instead of a reward penalty (PPO); unset
  /// (auto) = by algorithm.
  std::optional<kl_place> placement;
};
template <class V>
void visit(V& v, kl_config& c) {
  v.field("coef", c.coef, "β: reward penalty (PPO) or loss coefficient (GRPO); 0 = no reference");
  v.choice("estimator", c.estimator, "Per-token KL estimator");
  v.choice("controller", c.controller, "Fixed β, or adaptive towards target");
  v.field("target", c.target, "Adaptive controller: target KL per sequence");
  v.field("horizon", c.horizon, "Adaptive controller: horizon in samples");
  v.choice("placement", c.placement, "auto",
           "KL in the reward or as a loss term; auto = reward for ppo, loss for grpo");
}

/// A remote RewardService (rl.reward.kind: remote; NOTE [remote reward] in
/// cluster/remote_reward.hpp).
/// A user service troupe calls (a RewardService, an EnvironmentService):
/// where it is, how calls are secured, bounded, retried and batched.
struct remote_service_config {
  /// host:port of the service.
  std::string address;
  /// A file holding the bearer token sent with every call ("" = none).
  std::string token_file;
  /// TLS: the CA of the server's certificate ("" = plain text, loopback
  /// only), and a client pair for mutual TLS.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  /// Bound on each call.
  double timeout_s = 30;
  /// Attempts after the first failed one (unavailable, timed out,
  /// overloaded); the wait before attempt k is backoff_s · 2^(k-1).
  int64_t retries = 3;
  double backoff_s = 0.5;
  /// Samples per call, and calls in flight at once.
  int64_t batch_size = 64;
  int64_t max_in_flight = 4;
};
template <class V>
void visit(V& v, remote_service_config& c) {
  v.field("address", c.address, "host:port of the service");
  v.field("token_file", c.token_file, "File holding the bearer token; \"\" = none");
  v.field("ca_file", c.ca_file,
          "TLS: the server certificate's CA; \"\" = plain text (loopback only)");
  v.field("cert_file", c.cert_file, "Mutual TLS: this client's certificate");
  v.field("key_file", c.key_file, "Mutual TLS: this client's key");
  v.field("timeout_s", c.timeout_s, "Bound on each call");
  v.field("retries", c.retries, "Attempts after a failed one (unavailable, timed out, overloaded)");
  v.field("backoff_s", c.backoff_s, "Wait before the first retry, doubled for each next one");
  v.field("batch_size", c.batch_size, "Samples (sessions) per call");
  v.field("max_in_flight", c.max_in_flight, "Calls in flight at once");
}

/// Whether samples are scored while the rest of the batch generates.
enum class overlap_mode : uint8_t { automatic, on, off };
TROUPE_ENUM_NAMES(overlap_mode, "auto", "on", "off")

struct reward_config {
  /// rule | model | mixed (rule_weight·rule + model_weight·model) | remote.
  reward_kind kind = reward_kind::rule;
  /// The built-in tasks' rule; `rules` replaces it.
  rule_kind rule = rule_kind::positional;
  /// Verifiable rules with weights (NOTE [verifiable rewards]); empty = `rule`.
  std::vector<rule_config> rules;
  double rule_weight = 1.0;
  double model_weight = 1.0;
  /// Reward model: the rm stage's output, or a HF directory.
  std::string model_path;
  remote_service_config remote;
  /// Score samples as their prompts finish generating (NOTE [overlapped
  /// scoring]); auto = on for a remote reward.
  overlap_mode overlap = overlap_mode::automatic;
};
template <class V>
void visit(V& v, reward_config& c) {
  v.choice("kind", c.kind,
           "rule, a reward model, mixed = rule_weight·rule + model_weight·model, or a remote "
           "RewardService");
  v.choice("rule", c.rule, {rule_kind::positional, rule_kind::exact},
           "positional: partial credit per correct character; exact: 1 or 0");
  v.list("rules", c.rules,
         "Verifiable rules summed with their weights (replaces rule): exact, positional, math, "
         "regex, format, overlong");
  v.field("rule_weight", c.rule_weight);
  v.field("model_weight", c.model_weight);
  v.field("model_path", c.model_path, "Reward model directory; \"\" = the rm stage's output");
  v.section("remote", c.remote, "kind remote: the RewardService");
  v.choice("overlap", c.overlap,
           "Score samples while the rest of the batch generates; auto = on for a remote reward");
}

struct critic_config {
  /// Initial weights: rm (the reward model's trunk), sft, or base.
  model_source init = model_source::sft;
  optim_config optim;
  double value_clip = 0.2;
};
template <class V>
void visit(V& v, critic_config& c) {
  v.choice("init", c.init, "Initial critic trunk (the value head is fresh)");
  v.section("optim", c.optim);
  v.field("value_clip", c.value_clip, "Clip values to old ± this; 0 = off");
}

/// NOTE [dynamic sampling] (DAPO, Yu et al. 2025).
struct dynamic_sampling_config {
  /// Drop the groups whose samples all score the same (they teach a group
  /// estimator nothing) and refill the batch from further prompts.
  bool enabled = false;
  /// Refill rounds at most per iteration (each generates prompts_per_iteration
  /// more prompts); past it the batch is completed with dropped groups.
  int64_t max_rounds = 3;
};
template <class V>
void visit(V& v, dynamic_sampling_config& c) {
  v.field("enabled", c.enabled,
          "Drop groups whose samples all score the same and refill from further prompts");
  v.field("max_rounds", c.max_rounds,
          "Refill rounds at most per iteration; past it dropped groups complete the batch");
}

/// The rollout engine's settings in a job: the engine's own defaults, with
/// a smaller KV pool and a larger batch (RL batches are many short sequences).
inline inference::engine_config default_rollout() {
  inference::engine_config e;
  e.kv_cache_mb = 64;
  e.max_num_seqs = 256;
  e.max_batched_tokens = 4096;
  return e;
}

/// What scores an episode when the job has an environment (NOTE
/// [episodes]): its reward, the reward role's backends on the last turn,
/// or their sum.
enum class episode_score : uint8_t { environment, reward, sum };
TROUPE_ENUM_NAMES(episode_score, "environment", "reward", "sum")

/// rl.environment: multi-turn episodes (NOTE [environments], [episodes]).
struct environment_config {
  /// none: the batch path (one response per sample, scored by rl.reward).
  environment_kind kind = environment_kind::none;
  int64_t max_turns = 4;
  /// Tokens of an episode at most (prompt, turns, observations); 0 = the
  /// rollout's context (rl.rollout.max_model_len, else the model's).
  int64_t max_context = 0;
  /// How the model writes tool calls; unset (auto) = the chat template's
  /// format, hermes without one.
  std::optional<models::tool_call_format> tool_call_format;
  episode_score score = episode_score::environment;
  /// Bound on each environment call.
  double timeout_s = 30;
  /// Threads driving episodes; 0 = one per episode, up to 256.
  int64_t threads = 0;
  /// Episodes go on independently; false = in lockstep, turn by turn.
  bool overlap = true;
  /// kind remote: the EnvironmentService (batch_size: sessions per Reset call).
  remote_service_config remote;
};
template <class V>
void visit(V& v, environment_config& c) {
  v.choice("kind", c.kind,
           "none (single responses), task (the data's prompts, one turn, rule-scored), calculator "
           "(a calculator tool, several turns), remote (an EnvironmentService)");
  v.field("max_turns", c.max_turns, "Model turns per episode at most");
  v.field("max_context", c.max_context, "Tokens of an episode at most; 0 = the rollout's context");
  v.choice("tool_call_format", c.tool_call_format, "auto",
           "How the model writes tool calls; auto = its chat template's, else hermes");
  v.choice("score", c.score,
           "What scores an episode: the environment's reward, rl.reward on the last turn, or "
           "their sum");
  v.field("timeout_s", c.timeout_s, "Bound on each environment call");
  v.field("threads", c.threads, "Threads driving episodes; 0 = one per episode, up to 256");
  v.field("overlap", c.overlap,
          "Episodes go on while others wait for the environment; false = in lockstep (every "
          "episode's turn k in one call, after every step of turn k-1: the same batches in every "
          "run)");
  v.section("remote", c.remote, "kind remote: the EnvironmentService");
}

/// rl.agent: agent code as the rollout, through the OpenAI-compatible
/// endpoint (NOTE [agent runs] in actors/rl/agent_runs.hpp).
struct agent_config {
  /// The agent's argv, started once per iteration (no shell; argv[0] found
  /// on PATH when it has no slash); empty = off.
  std::vector<std::string> command;
  /// Every episode of an iteration has its reward by then (seconds), or
  /// the iteration fails naming the missing episodes.
  double timeout_s = 600;
  /// The endpoint's address (host:port, port 0 = an ephemeral one); any
  /// but loopback needs tls_cert_file and tls_key_file.
  std::string listen = "127.0.0.1:0";
  std::string tls_cert_file;
  std::string tls_key_file;
  /// Calls per episode at most; 0 = rl.environment.max_turns.
  int64_t max_calls = 0;
  /// Calls served at once.
  int64_t threads = 64;
  /// Where the agent's stdout and stderr go ("" = <run dir>/agent/agent.log).
  std::string log_file;
  bool enabled() const { return !command.empty(); }
};
template <class V>
void visit(V& v, agent_config& c) {
  v.field("command", c.command,
          "The agent's argv, run once per iteration with OPENAI_BASE_URL, OPENAI_API_KEY and "
          "TROUPE_AGENT_TASKS (no shell); [] = off");
  v.field("timeout_s", c.timeout_s,
          "Every episode of an iteration has its reward by then, or the iteration fails naming "
          "the missing ones");
  v.field("listen", c.listen, "The endpoint's host:port (port 0 = ephemeral); loopback unless TLS");
  v.field("tls_cert_file", c.tls_cert_file, "TLS certificate of the endpoint (PEM)");
  v.field("tls_key_file", c.tls_key_file, "TLS key of the endpoint (PEM)");
  v.field("max_calls", c.max_calls, "Calls per episode at most; 0 = rl.environment.max_turns");
  v.field("threads", c.threads, "Calls served at once");
  v.field("log_file", c.log_file,
          "The agent's stdout and stderr; \"\" = <run dir>/agent/agent.log");
}

struct rl_config {
  algorithm_kind algorithm = algorithm_kind::ppo;
  /// Unset (auto) = gae for ppo, grpo for grpo.
  std::optional<kernels::advantage_estimator> advantage;
  int64_t iterations = 100;
  int64_t prompts_per_iteration = 64;
  int64_t samples_per_prompt = 1;
  int64_t epochs = 1;
  int64_t minibatches = 2;
  /// The policy loss (NOTE [policy loss spec] in kernels/losses.hpp).
  kernels::policy_loss_kind policy_loss = kernels::policy_loss_kind::ppo;
  /// ε of both sides of the ratio clip; clip_ratio_low / _high override a side.
  double clip_ratio = 0.2;
  std::optional<double> clip_ratio_low;
  std::optional<double> clip_ratio_high;
  /// ppo's dual clip c (> 1); null = off.
  std::optional<double> clip_ratio_c = 3.0;
  double entropy_coef = 0.0;
  double gamma = 1.0;
  double lam = 0.95;
  bool whiten_advantages = true;
  /// grpo: divide by the group's std (false = Dr. GRPO).
  bool norm_adv_by_std = true;
  kernels::loss_agg_mode loss_agg = kernels::loss_agg_mode::token_mean;
  /// seq-mean-token-sum-norm's divisor; 0 = the batch's response columns.
  double loss_scale_factor = 0;
  /// policy: recompute old log-probs with the policy; engine: the rollout's.
  logprob_source old_logprobs = logprob_source::policy;
  /// Batches generated ahead of training (NOTE [staleness]): 0 =
  /// synchronous; k = the next k batches are generated while this one
  /// trains, each sampled by weights at most k versions old.
  int64_t staleness = 0;
  /// NOTE [in-flight update]: the rollout loads each new version while it
  /// generates the batches ahead (tokens tagged with their versions),
  /// instead of the driver waiting for them before weight_sync.
  bool inflight_updates = false;
  /// NOTE [paced rollout]: with in-flight updates, the engine steps the
  /// rollout runs each iteration after the batch ahead is requested, before
  /// it takes the next version — where versions switch is then
  /// reproducible (and a checkpoint's resumption exact); 0 = it steps until
  /// the version arrives.
  int64_t inflight_steps = 0;
  /// Cap of the importance weight π_policy / π_behaviour of stale samples.
  double stale_is_cap = 2.0;
  dynamic_sampling_config dynamic_sampling;
  /// NOTE [true on-policy]: the rollout and the policy compute log-probs
  /// through the batch-invariant forward, so the sampled, old and first
  /// update log-probs are equal bit for bit.
  bool true_on_policy = false;
  optim_config actor_optim;
  critic_config critic;
  reward_config reward;
  environment_config environment;
  agent_config agent;
  kl_config kl;
  generation_config generation;
  /// Evaluation: held-out score every N iterations (and at the end).
  int64_t eval_every = 10;
  /// Held-out sampling: temperature (0 = greedy only) and responses per prompt.
  double eval_temperature = 1.0;
  int64_t eval_samples = 4;
  /// Checkpoint every N iterations (and at the end); 0 = only at the end.
  int64_t checkpoint_every = 10;
  inference::engine_config rollout = default_rollout();
};
template <class V>
void visit(V& v, rl_config& c) {
  v.choice("algorithm", c.algorithm, "ppo (critic + GAE) or grpo (groups, no critic)");
  v.choice("advantage", c.advantage, "auto", "Advantage estimator; auto = gae for ppo, grpo for grpo");
  v.field("iterations", c.iterations, "RL iterations (generate → score → update → sync)");
  v.field("prompts_per_iteration", c.prompts_per_iteration);
  v.field("samples_per_prompt", c.samples_per_prompt, "n responses per prompt (a GRPO group)");
  v.field("epochs", c.epochs, "Passes over each iteration's batch");
  v.field("minibatches", c.minibatches, "Optimizer steps per epoch");
  v.choice("policy_loss", c.policy_loss,
           "ppo (clipped token ratio), gspo (clipped sequence ratio, length-normalised), cispo "
           "(clipped stop-gradient IS weight × log-prob); docs/rlhf.md");
  v.field("clip_ratio", c.clip_ratio, "Ratio clip ε, both sides");
  v.field("clip_ratio_low", c.clip_ratio_low, "Lower clip ε (floor 1 − ε); null = clip_ratio");
  v.field("clip_ratio_high", c.clip_ratio_high,
          "Upper clip ε (cap 1 + ε; DAPO's clip-higher); null = clip_ratio");
  v.field("clip_ratio_c", c.clip_ratio_c,
          "ppo's dual clip c > 1: for A < 0 the loss is capped at −c·A; null = off");
  v.field("entropy_coef", c.entropy_coef, "Entropy bonus coefficient");
  v.field("gamma", c.gamma, "Discount");
  v.field("lam", c.lam, "GAE λ");
  v.field("whiten_advantages", c.whiten_advantages,
          "gae: normalise advantages over the batch's response tokens");
  v.field("norm_adv_by_std", c.norm_adv_by_std,
          "grpo: divide by the group's standard deviation; false = Dr. GRPO");
  v.choice("loss_agg", c.loss_agg,
           "How per-token losses become a scalar (gspo: always seq-mean-token-mean)");
  v.field("loss_scale_factor", c.loss_scale_factor,
          "seq-mean-token-sum-norm: the divisor of the token sum; 0 = the batch's response "
          "columns (max_tokens)");
  v.choice("old_logprobs", c.old_logprobs, "Old log-probs from the policy's forward, or the rollout engine's");
  v.field("staleness", c.staleness,
          "Batches generated ahead: 0 = synchronous; k = the next k batches are generated while "
          "this one trains, by weights at most k versions old");
  v.field("inflight_updates", c.inflight_updates,
          "With staleness > 0: the rollout loads each new version between decode steps while it "
          "generates ahead (tokens tagged with their versions), instead of waiting for those "
          "batches first");
  v.field("inflight_steps", c.inflight_steps,
          "With in-flight updates: engine steps the rollout runs each iteration after the "
          "batch ahead is requested, then it takes the next version (reproducible switch "
          "points, exact resume); 0 = it steps until the version arrives (timing-dependent)");
  v.field("stale_is_cap", c.stale_is_cap,
          "Cap of the per-token importance weight correcting stale samples' advantages");
  v.section("dynamic_sampling", c.dynamic_sampling,
            "DAPO's dynamic sampling: a batch of groups whose scores differ");
  v.field("true_on_policy", c.true_on_policy,
          "Rollout and policy log-probs through batch-invariant CPU kernels: the engine's "
          "sampled log-probs equal the old and the first update's bit for bit (every ratio "
          "1.0); slower (docs/data-and-rewards.md)");
  v.section("actor_optim", c.actor_optim, "Policy optimizer");
  v.section("critic", c.critic, "Critic (ppo / gae only)");
  v.section("reward", c.reward);
  v.section("environment", c.environment,
            "Multi-turn episodes with an environment (docs/agents.md); kind none = off");
  v.section("agent", c.agent,
            "Agent code as the rollout, through an OpenAI-compatible endpoint (docs/agents.md)");
  v.section("kl", c.kl, "KL to the reference (the initial policy)");
  v.section("generation", c.generation, "Rollout sampling");
  v.field("eval_every", c.eval_every, "Held-out score every N iterations; 0 = end only");
  v.field("eval_temperature", c.eval_temperature,
          "Held-out score: mean rule score of responses sampled at this temperature "
          "(val/score/mean; the greedy score is val/greedy/score/mean); 0 = greedy only");
  v.field("eval_samples", c.eval_samples, "Held-out responses per prompt when sampling");
  v.field("checkpoint_every", c.checkpoint_every, "Checkpoint every N iterations; 0 = end only");
  v.section("rollout", c.rollout, "Inference engine of the rollout role");
}

/// How the trainer's weights reach the rollout engine after each update
/// (runtime/weight_transport.hpp).
struct weight_sync_config {
  /// Unset (auto) = the channel that fits the pair (NOTE [weight transport
  /// choice] in placement.hpp).
  std::optional<runtime::transport_kind> transport;
  /// disk: folder of the versions; "" = <run dir>/<stage>/weights.
  std::string dir;
  /// Versions kept by shm and disk.
  int64_t keep = 2;
};
template <class V>
void visit(V& v, weight_sync_config& c) {
  v.choice("transport", c.transport, "auto",
           "auto (one process: alias, zero copy; one host: shm; two hosts: disk when dir is "
           "set, else broadcast), alias, shm (shared memory), broadcast (gloo, trainer rank 0 → "
           "rollout), disk (safetensors + manifest), or cuda_ipc (CUDA IPC handles, one host, "
           "CUDA builds)");
  v.field("dir", c.dir, "disk: folder of the published versions (across hosts: one both see); "
                       "\"\" = <run dir>/<stage>/weights");
  v.field("keep", c.keep, "shm and disk: published versions kept");
}

/// The machines a job may use: nodes × devices per node. A device is one
/// worker process (on CPU) or one GPU. NOTE [nodes of a plan] in
/// placement.hpp says which devices go on which node.
struct resources_config {
  int64_t nodes = 1;
  /// Who starts the worker processes: local (the driver, on its machine),
  /// nodes (the controller's node agents), auto (nodes when the job is run
  /// by a controller with ready nodes, else local).
  launcher_kind launcher = launcher_kind::automatic;
  /// 0 = as many as the placement's pools need.
  int64_t devices_per_node = 0;
  /// Memory of one device for the planner's check, GiB; 0 = this machine's
  /// memory divided by the devices.
  double device_memory_gb = 0;
};
template <class V>
void visit(V& v, resources_config& c) {
  v.field("nodes", c.nodes, "Nodes; devices fill them in pool order, devices_per_node each");
  v.choice("launcher", c.launcher, "Who starts the workers: local (the driver's machine), nodes (a controller's node "
           "agents: troupe node), auto (nodes when a controller with ready nodes runs the job)");
  v.field("devices_per_node", c.devices_per_node,
          "Devices (worker processes on cpu) per node; 0 = the pools' devices / nodes, rounded up");
  v.field("device_memory_gb", c.device_memory_gb,
          "Memory per device for the planner's estimate check; 0 = host memory / devices");
}

/// A pool: a set of devices (worker processes) that host roles together.
struct pool_config {
  std::string name;
  int64_t devices = 1;
};
template <class V>
void visit(V& v, pool_config& c) {
  v.field("name", c.name, "Pool name");
  v.field("devices", c.devices, "Devices (worker processes) of the pool");
}

/// Where one role runs: its pool and its parallel layout (NOTE [parallel
/// layout] in roles.hpp: dp × tp × pp ranks on the pool's first devices).
struct role_placement_config {
  std::string role;
  std::string pool;
  int64_t dp = 1;
  int64_t tp = 1;
  int64_t pp = 1;
  /// Layers of each pipeline stage (empty: an even split).
  std::vector<int64_t> pp_layers;
  /// Micro-batches a stage's batch is cut into (0: as many as stages).
  int64_t pp_micro_batches = 0;
  /// How the DP dimension trains (ddp: replicas all-reduce gradients).
  dp_strategy strategy = dp_strategy::ddp;
  /// Rows a rank computes at once (gradients accumulate over its share); 0 = its whole share.
  int64_t micro_batch_rows = 0;
  /// Or padded tokens at once, rows grouped by length (NOTE [token micro-batches]); 0 = off.
  int64_t micro_batch_tokens = 0;
  /// DP gradient buckets, MiB.
  double bucket_mb = 25;
  /// The dtype it computes in (NOTE [mixed precision]).
  precision compute = precision::fp32;
};
template <class V>
void visit(V& v, role_placement_config& c) {
  v.field("role", c.role, "policy | critic | reference | reward | rollout");
  v.field("pool", c.pool, "The pool that hosts it");
  v.field("dp", c.dp,
          "Data-parallel ranks (trained roles: policy, critic, the rm stage's reward); the "
          "rollout's: independent engines splitting the prompts");
  v.field("tp", c.tp,
          "Tensor-parallel ranks per DP replica (trained roles; heads and the intermediate size "
          "divisible by it; docs/parallelism.md)");
  v.field("pp", c.pp,
          "Pipeline stages per replica (trained roles; at most the layers; docs/parallelism.md)");
  v.field("pp_layers", c.pp_layers,
          "Layers of each pipeline stage, one count a stage summing to the layers; empty = even");
  v.field("pp_micro_batches", c.pp_micro_batches,
          "Micro-batches a pipelined batch is cut into, run 1F1B (>= pp); 0 = pp");
  v.choice("strategy", c.strategy,
           "How the dp ranks train: ddp (replicas), zero1 / zero2 / zero3 (sharded state; "
           "docs/parallelism.md)");
  v.field("micro_batch_rows", c.micro_batch_rows,
          "Rows a rank computes at once, gradients accumulated; 0 = its whole share");
  v.field("micro_batch_tokens", c.micro_batch_tokens,
          "Or padded tokens a rank computes at once, rows grouped by length (dynamic batch "
          "size); 0 = off");
  v.field("bucket_mb", c.bucket_mb, "DP gradient all-reduce bucket size, MiB (reverse parameter order)");
  v.choice("precision", c.compute,
           "fp32, or bf16: bf16 weights, activations and gradients with fp32 master weights "
           "and AdamW state (roles a train engine runs; docs/parallelism.md)");
}

/// NOTE [placement modes]: in_process runs every role in the driver's
/// process (no workers). colocated puts every role in one pool, so roles
/// share devices and take turns. disaggregated separates generation
/// (rollout) from training (policy, critic) in different pools. hybrid is
/// any mapping. Roles not listed go to the first pool.
struct placement_config {
  placement_mode mode = placement_mode::in_process;
  /// Roles sharing a process free what they hold idle between phases.
  bool offload = false;
  std::vector<pool_config> pools;
  std::vector<role_placement_config> roles;
};
template <class V>
void visit(V& v, placement_config& c) {
  v.choice("mode", c.mode, "in_process (no workers), colocated (one pool), disaggregated (rollout apart from "
           "the trainers) or hybrid (any mapping)");
  v.field("offload", c.offload,
          "Free idle state between phases: the rollout's KV pool after generation, the "
          "reference's and a reward model's weights after their phase, the trainers' "
          "optimizer states and gradients after their update (files in <run dir>/rl/offload)");
  v.list("pools", c.pools, "Device pools (colocated default: one pool of one device)");
  v.list("roles", c.roles, "Role → pool and dp; roles not listed go to the first pool");
}

/// NOTE [supervision] (supervision.hpp): how often a lost role of the rl
/// stage is restarted. A role not listed takes its default (role_traits:
/// rollout, reward and reference 3 restarts, the trainers none).
struct role_restart_config {
  std::string role;
  /// -1 = the role's default (role_traits::default_restarts).
  int64_t max_restarts = -1;
  double window_s = 600;
  int64_t backoff_ms = 200;
};
template <class V>
void visit(V& v, role_restart_config& c) {
  v.field("role", c.role, "policy | critic | reference | reward | rollout");
  v.field("max_restarts", c.max_restarts,
          "Restarts allowed within window_s; 0 = a loss fails the job; -1 = the role's default "
          "(3 for rollout, reward and reference; 0 for the trainers, which restart from a "
          "surviving DP peer under ddp, else by rolling the rl stage back to its last "
          "checkpoint)");
  v.field("window_s", c.window_s, "The sliding window max_restarts counts in, seconds");
  v.field("backoff_ms", c.backoff_ms, "Pause before a restart, milliseconds");
}

struct supervision_config {
  /// Restarts of all roles together the job may take; 0 = none.
  int64_t budget = 10;
  /// NOTE [heartbeats] (cluster/workers.cpp): the driver's ping interval
  /// to each worker process; 0 = off.
  double heartbeat_s = 2;
  std::vector<role_restart_config> roles;
};
template <class V>
void visit(V& v, supervision_config& c) {
  v.field("budget", c.budget,
          "Restarts of all roles together before a loss fails the job (0 = every loss fails it)");
  v.field("heartbeat_s", c.heartbeat_s,
          "Heartbeat interval to each worker process: one silent for 2 intervals (stopped), "
          "and the workers of a collective every rank of which has been inside it for 2 "
          "(deadlocked), are killed and their roles lost, so a hang is found within 3; 0 = off");
  v.list("roles", c.roles,
         "Per role: max_restarts, window_s, backoff_ms (unlisted: rollout, reward and "
         "reference restart up to 3 times in 600 s, the trainers never unless listed)");
}

/// How an injected fault ends a role: it dies (kill), or its rank blocks
/// for good inside a collective while its process runs on (hang: NOTE
/// [deadlocked collectives] in cluster/heartbeats.hpp).
enum class kill_how : uint8_t { kill, hang };
TROUPE_ENUM_NAMES(kill_how, "kill", "hang")

/// NOTE [kill injection]: the role (rank `rank`) dies at its first request
/// of `phase` ("" = any) in iteration `iteration` (from 1) of the rl stage;
/// with `collective` n > 0, a trainer's DP rank dies inside the n-th
/// operation of its DP group in that phase instead (NOTE [kill inside a
/// collective]), or with `how: hang` blocks there for good.
struct kill_point {
  std::string role;
  std::string phase;
  int64_t iteration = 0;
  int64_t rank = 0;
  int64_t collective = 0;
  kill_how how = kill_how::kill;
};
template <class V>
void visit(V& v, kill_point& c) {
  v.field("role", c.role, "The role that dies");
  v.field("phase", c.phase,
          "The rl phase whose request it dies at (\"\" = its first that iteration)");
  v.field("iteration", c.iteration, "The rl iteration, from 1");
  v.field("rank", c.rank, "Its rank");
  v.field("collective", c.collective,
          "0 = at the request; n > 0 = inside the n-th collective operation of its DP group "
          "(a trainer with dp >= 2, in its update phase)");
  v.choice("how", c.how,
           "kill = the process ends; hang = the rank blocks for good inside collective n while "
           "its process runs (found by the heartbeats as a deadlocked collective; needs "
           "workers and collective > 0)");
}

/// Fault injection for tests of failure handling: the role fails (an error
/// from its actor) when asked to do `phase` in iteration `iteration`; the
/// kills end roles (processes) as a crash would.
struct debug_config {
  std::string fail_role;
  std::string fail_phase;
  int64_t fail_iteration = 0;
  std::vector<kill_point> kills;
};
template <class V>
void visit(V& v, debug_config& c) {
  v.field("fail_role", c.fail_role, "Testing only: role that fails (\"\" = none)");
  v.field("fail_phase", c.fail_phase, "Testing only: phase in which it fails");
  v.field("fail_iteration", c.fail_iteration, "Testing only: iteration in which it fails");
  v.list("kills", c.kills,
         "Testing only: roles killed (their process in a worker, their actor in the driver's) "
         "at a request, as a crash would (docs/supervision.md)");
}

struct job_config {
  run_config run;
  std::vector<std::string> stages = {"sft", "rm", "rl"};
  data_config data;
  model_config model;
  sft_config sft;
  rm_config rm;
  dpo_config dpo;
  rl_config rl;
  weight_sync_config weight_sync;
  resources_config resources;
  placement_config placement;
  supervision_config supervision;
  debug_config debug;
};
template <class V>
void visit(V& v, job_config& c) {
  v.section("run", c.run);
  v.field("stages", c.stages, "Stages in order, from: sft, rm, dpo, rl");
  v.section("data", c.data, "Prompts, demonstrations and preference pairs");
  v.section("model", c.model, "The base model");
  v.section("sft", c.sft, "Supervised fine-tuning on demonstrations");
  v.section("rm", c.rm, "Reward-model training on preference pairs (Bradley–Terry)");
  v.section("dpo", c.dpo, "Direct preference optimisation of the policy on preference pairs");
  v.section("rl", c.rl, "Reinforcement learning (PPO or GRPO)");
  v.section("weight_sync", c.weight_sync, "Trainer → rollout weight transfer");
  v.section("resources", c.resources, "Nodes and devices the job may use");
  v.section("placement", c.placement, "Which processes host which roles (troupe plan shows it)");
  v.section("supervision", c.supervision,
            "Restarting a role of the rl stage that was lost (docs/supervision.md)");
  v.section("debug", c.debug);
}

/// Cross-field rules (found by ADL from load_config).
void check(const job_config& c, runtime::config_checks& checks);

/// The effective advantage estimator of `c`.
kernels::advantage_estimator resolved_advantage(const rl_config& c);

/// The actor's loss of `c` (NOTE [policy loss spec]) with KL loss coefficient `kl_coef`.
kernels::policy_loss_spec actor_loss_spec(const rl_config& c, double kl_coef);
/// Whether the KL term goes into the loss (true) or the reward (false).
bool kl_in_loss(const rl_config& c);
/// Whether the job uses a critic (gae).
bool uses_critic(const rl_config& c);
/// Whether the job runs stage `name` ("sft", "rm", "rl").
bool has_stage(const job_config& c, std::string_view name);
/// Whether the reward needs a reward model.
bool uses_reward_model(const reward_config& c);
/// Whether the reward sums rules (kind rule or mixed).
bool uses_rules(const reward_config& c);
/// Whether samples are scored while the batch generates.
bool overlaps_scoring(const reward_config& c);
/// The rules the reward's rule part sums: `rules`, or `rule` alone.
std::vector<rule_config> reward_rules(const reward_config& c);

/// Tokens of the built-in task's longest prompt with the byte tokenizer
/// (its characters + BOS); 0 when the task settings are invalid.
int64_t max_task_prompt_tokens(const data_config& c);

/// The rollout engine's settings: rl.rollout, the run's seed, and the work
/// it expects (NOTE [kv pool size]): the larger of an iteration's
/// responses and an evaluation's, each at most the built-in task's longest
/// prompt plus rl.generation.max_tokens (unknown with prompt files).
inference::engine_config engine_settings(const job_config& cfg);

/// What a run needs of this machine, at its YAML location: run.dir and
/// weight_sync.dir folders it can create and write (not a file, not under
/// /proc, /sys or /dev), and every file and folder the job names (data
/// files, model.path, the reward model, the remote reward's token and TLS
/// files) present and readable. Nothing is created.
void check_job_paths(const job_config& c, runtime::config_checks& checks);

/// Loads and checks a job file with `--set` overrides, for a run here: an
/// empty job file is refused, and check_job_paths applies.
expected<job_config> load_job(const std::string& path, const std::vector<std::string>& overrides);

} // namespace troupe::actors::rl
