#pragma once
// Internal to actors/rl: what the stage drivers share (job.cpp runs SFT and
// RM, rl_stage.cpp runs PPO / GRPO).

#include "actors/inference/rollout.hpp"
#include "actors/job/job_actor.hpp"
#include "actors/rl/agent_book.hpp"
#include "actors/rl/cast.hpp"
#include "actors/rl/data.hpp"
#include "actors/rl/episodes.hpp"
#include "actors/rl/job.hpp"
#include "actors/rl/placement.hpp"
#include "actors/rl/reward.hpp"
#include "actors/rl/roles.hpp"
#include "actors/rl/stage_table.hpp"
#include "actors/train/engine_actor.hpp"
#include "models/llama.hpp"
#include "models/tokenizer.hpp"
#include "runtime/checkpoint.hpp"
#include "runtime/logging.hpp"

#include <caf/all.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace troupe::actors::rl::detail {

namespace fs = std::filesystem;

/// What a request to a role does, for its timeout (run.timeouts).
enum class request_kind { control, compute, generate, weights, state };

struct job_context {
  caf::actor_system* sys = nullptr;
  /// The job as it runs now: the config plus the runtime settings applied
  /// so far (NOTE [runtime settings]); `cfg` points here.
  job_config live;
  const job_config* cfg = &live;
  const run_options* opts = nullptr;
  /// The driver actor and its link to the job actor (NOTE [job boundaries]).
  caf::blocking_actor* self = nullptr;
  const job::driver_link* link = nullptr;
  std::shared_ptr<runtime::job_logger> log;
  std::shared_ptr<const models::tokenizer> tok;
  int64_t pad = 0;
  /// Rows' prompts as tokens (NOTE [prompt encoding]).
  prompt_encoder enc;
  /// The base model's context (max_position_embeddings).
  int64_t model_context = 0;
  /// The rl stage's environment (NOTE [environments]); null without one.
  std::shared_ptr<environment> env;
  /// rl.agent: what the agent's calls recorded (NOTE [agent runs]); null
  /// without an agent.
  std::shared_ptr<agent_book> agents;
  job_data data;
  fs::path run_dir;
  /// HF directory of the base model.
  std::string base_dir;
  /// Where roles run: run_options::host, or this process.
  role_host* host = nullptr;
  /// The placement's plan (dp sizes of the roles).
  placement_plan plan;
  /// The resolved job, for role specs.
  std::string job_yaml;
  /// Prefix of this job's shared-memory channels (unique per job).
  std::string channel_prefix;
  /// The TCPStore of broadcast weight channels (opened on first use).
  std::shared_ptr<void> weight_store;
  /// NOTE [supervision]: a channel whose ends meet in a collective
  /// (broadcast) is named anew after a rollout restart or a rollback, so
  /// both ends open a new group (weight_channel_for).
  int64_t channel_generation = 0;
  std::string weight_store_addr;
  /// NOTE [busy on replies]: seconds the trainers and the reward spent on
  /// this job's requests so far, and the rollout's counters of its latest
  /// answer.
  double roles_busy_s = 0;
  inference::engine_metrics rollout_seen;
  /// NOTE [supervision]: the counters of rollouts lost so far (the last
  /// seen of each), added to the current one's so rollout_seen keeps
  /// counting up across a restart.
  inference::engine_metrics rollout_base;
  /// The latest weight version the trainer published, by stage (a
  /// restarted rollout receives it again).
  std::map<std::string, int64_t> published;

  job_context() = default;
  job_context(const job_context&) = delete;

  /// Emits one event to the job's stream.
  void emit(job::event_body e) const { link->emit(std::move(e)); }
  /// Emits one step's metrics (and calls run_options::on_progress).
  void metrics(const std::string& stage, int64_t step, int64_t total, const train::metric_map& m,
               double elapsed_s) const;
  /// NOTE [job boundaries]: the job actor's orders at `p` ({} when nothing
  /// is pending); a set run_options::stop flag reads as cancel. Checkpoints
  /// ordered here are written with `checkpoint` (then `checkpoint` is true
  /// in the answer), as often as asked (while paused).
  expected<job::boundary_reply> boundary(const job::boundary_point& p,
                                         const std::function<expected<void>()>& checkpoint) const;
  /// The longest wait for a request of `kind`.
  caf::timespan timeout_of(request_kind kind) const;
  /// The output model directory of a finished stage ("base" = the base model).
  std::string model_dir(const std::string& stage) const;
};

/// Writes checkpoint PREFIX_<step> of `stage` (NOTE [checkpoint commit]) and
/// emits its event.
expected<void> commit_checkpoint(job_context& ctx, const std::string& stage, int64_t step,
                                 const char* prefix, const runtime::checkpoint_files& files);

/// NOTE [sharded checkpoints]: a trained role's state in a checkpoint is
/// its ranks' shards (NOTE [sharded state] in actors/train/train_engine.hpp),
/// "<name>.shard-<r>" each, written without gathering, and
/// "<name>.shards.json" ({"shards", "strategy", "dp"}: what wrote them);
/// the checkpoint's manifest makes them one atomic write. They load under any
/// DP size and strategy. A checkpoint of an earlier version holds
/// "<name>.state" whole instead, which still loads.
expected<void> save_role_state(job_context& ctx, const train::engine_actor& trainer,
                               const std::string& role, const std::string& name,
                               runtime::checkpoint_files& files);
/// Whether `files` hold a state named `name` (either form).
bool has_role_state(const runtime::checkpoint_files& files, const std::string& name);
/// Loads state `name` of `files` (in checkpoint `dir`) into `trainer`.
expected<void> load_role_state(job_context& ctx, const train::engine_actor& trainer,
                               const std::string& name, const runtime::checkpoint_files& files,
                               const std::string& dir);

/// The job's tokenizer (model.path's, or the byte tokenizer) and pad id.
struct job_tokenizer_info {
  std::shared_ptr<const models::tokenizer> tok;
  int64_t pad = 0;
};
expected<job_tokenizer_info> job_tokenizer(const model_config& m);

/// Held while torch's process-global RNG is seeded and used (two jobs in
/// one process take turns).
std::mutex& torch_rng_mutex();

/// Loads a model from a HF directory with torch's RNG seeded first (fresh
/// heads are then deterministic). Serialised: the RNG is process-global.
expected<models::llama_model> load_model(const std::string& dir, models::head_kind head,
                                         bool allow_missing_head, uint64_t seed);

/// The error of a failed request, as a troupe error naming `what`
/// (timeouts and dead actors included).
caf::error request_error(const caf::error& err, const std::string& what, caf::timespan timeout);

/// A blocking request: the reply, or the error naming `what`.
template <class R, class Handle, class... Ts>
expected<R> ask(caf::blocking_actor* self, const Handle& h, caf::timespan timeout,
                const std::string& what, Ts&&... xs) {
  expected<R> out = make_error(errc::internal, what + ": no reply");
  self->request(h, timeout, std::forward<Ts>(xs)...)
      .receive([&](R& r) { out = std::move(r); },
               [&](caf::error& err) { out = request_error(err, what, timeout); });
  return out;
}

/// A request whose reply carries the role's serving time (NOTE [busy on
/// replies]): the value; the seconds are added to ctx.roles_busy_s.
template <class R, class Handle, class... Ts>
expected<R> ask_served(job_context& ctx, const Handle& h, request_kind kind, const std::string& what,
                       Ts&&... xs) {
  auto r = ask<train::served<R>>(ctx.self, h, ctx.timeout_of(kind), what, std::forward<Ts>(xs)...);
  if (!r)
    return r.error();
  ctx.roles_busy_s += r->busy_s;
  return std::move(r->value);
}

/// The rollout's answer `g`: keeps its engine counters when they are the
/// newest seen (answers to overlapping calls may arrive in any order).
std::vector<inference::request_output> take_generation(job_context& ctx, inference::generation&& g);

/// NOTE [episodes]: the runner's options from rl.environment for `step`:
/// the context within the rollout's, the tool-call format (auto: the chat
/// template's, else hermes), the environment and generate bounds.
episode_options episode_options_of(const job_context& ctx, int64_t step);

/// Generates `reqs` to completion on `rollout`: the outputs in order.
expected<std::vector<inference::request_output>> generate(job_context& ctx,
                                                           const inference::rollout_actor& rollout,
                                                           std::vector<inference::generate_request> reqs,
                                                           const std::string& what);

/// Wall-clock seconds since construction.
struct stopwatch {
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  double seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

/// Held-out score of the weights already in `rollout`: the mean rule score
/// of rl.eval_samples responses per eval prompt sampled at
/// rl.eval_temperature (val/score/mean, val/accuracy = exact-match rate),
/// and of the greedy response (val/greedy/...; with eval_temperature 0 the
/// greedy numbers are val/...).
expected<void> evaluate(caf::blocking_actor* self, job_context& ctx,
                        const inference::rollout_actor& rollout, train::metric_map& m,
                        const std::string& stage, int64_t step);

/// The trainer → rollout channel of `stage` (weight_sync in the job file).
expected<actors::weight_channel> weight_channel_for(job_context& ctx, const std::string& stage);

/// The trainer publishes its weights as `version` on the stage's channel and
/// the rollout receives and loads them (a weight_sync event).
expected<void> sync_weights(caf::blocking_actor* self, job_context& ctx, const std::string& stage,
                            const train::engine_actor& trainer,
                            const inference::rollout_actor& rollout, int64_t version);

/// The rollout receives and loads `version`, already published on the
/// stage's channel (a restarted rollout: NOTE [supervision]). Not for a
/// channel whose ends meet in a collective (errc::unsupported).
expected<actors::sync_bytes> receive_weights(caf::blocking_actor* self, job_context& ctx,
                                             const std::string& stage,
                                             const inference::rollout_actor& rollout,
                                             int64_t version);

/// An empty cast of `stage` on the job's host, with the job's timeouts,
/// plan and events (NOTE [the cast]).
cast make_cast(job_context& ctx, stage_id stage, int rollbacks = 0);

/// NOTE [supervised stages]: sft, rm and dpo train one role a step at a
/// time over a seeded data stream. One loop runs them — its step boundaries
/// (commands, cancel, checkpoints), events, metrics, evaluation every
/// eval_every steps (and at the end) followed by a checkpoint, and the
/// trained model's save — and each stage supplies its step and its
/// evaluation (stage_steps), made once its roles are up.
struct supervised_stage {
  stage_id id = stage_id::sft;
  std::string name;
  /// The role it trains.
  role_id trainer = role_id::policy;
  int64_t steps = 0;
  int64_t eval_every = 0;
  /// The directory its roles' models start from.
  std::string init_dir;
};
struct stage_steps {
  /// Optimizer step `step` (from 0): its metrics.
  std::function<expected<train::metric_map>(int64_t step)> train;
  /// The evaluation after step `step`, into its metrics.
  std::function<expected<void>(train::metric_map& m, int64_t step)> evaluate;
};
using make_steps_fn = std::function<expected<stage_steps>(job_context& ctx, const cast& roles)>;
expected<stage_summary> run_supervised(job_context& ctx, const supervised_stage& st,
                                       const make_steps_fn& make_steps);

/// The preference rows of step `step` (a seeded stream per `salt`).
std::vector<int64_t> preference_indices(const job_config& cfg, const job_data& data, uint64_t salt,
                                        int64_t step, int64_t batch_size);

/// The stage drivers (NOTE [stage table]).
expected<stage_summary> run_sft_stage(job_context& ctx);
expected<stage_summary> run_rm_stage(job_context& ctx);
expected<stage_summary> run_dpo_stage(job_context& ctx);
expected<stage_summary> run_rl_stage(job_context& ctx);

} // namespace troupe::actors::rl::detail
