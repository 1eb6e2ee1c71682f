#pragma once
// Internal to actors/rl: what the stage drivers share (job.cpp runs SFT and
// RM, rl_stage.cpp runs PPO / GRPO).

#include "actors/inference/rollout.hpp"
#include "actors/rl/data.hpp"
#include "actors/rl/job.hpp"
#include "actors/rl/placement.hpp"
#include "actors/rl/reward.hpp"
#include "actors/rl/roles.hpp"
#include "actors/train/engine_actor.hpp"
#include "models/llama.hpp"
#include "models/tokenizer.hpp"

#include <caf/all.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

namespace troupe::actors::rl::detail {

namespace fs = std::filesystem;

/// Appends one JSON line per step to metrics.jsonl (flushed per line).
class metrics_log {
public:
  /// Opens (creating) the file; on resume drops the lines of `stage` past
  /// `keep_until` and of every stage after it, so re-run steps are not
  /// duplicated.
  expected<void> open(const std::string& path);
  expected<void> truncate(const std::vector<std::string>& stage_order, const std::string& stage,
                          int64_t keep_until);
  expected<void> write(const std::string& stage, int64_t step, const train::metric_map& m);
  ~metrics_log();

private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

struct job_context {
  caf::actor_system* sys = nullptr;
  const job_config* cfg = nullptr;
  const run_options* opts = nullptr;
  std::shared_ptr<const models::tokenizer> tok;
  int64_t pad = 0;
  job_data data;
  fs::path run_dir;
  caf::timespan timeout{};
  /// HF directory of the base model.
  std::string base_dir;
  metrics_log log;
  /// Where roles run: run_options::host, or this process.
  role_host* host = nullptr;
  /// The placement's plan (dp sizes of the roles).
  placement_plan plan;
  /// The resolved job, for role specs.
  std::string job_yaml;
  /// The TCPStore of broadcast weight channels (opened on first use).
  std::shared_ptr<void> weight_store;
  std::string weight_store_addr;

  bool stop_requested() const { return opts->stop && opts->stop->load(); }
  /// Reports one step to the log and the progress callback.
  expected<void> emit(const std::string& stage, int64_t step, int64_t total,
                      const train::metric_map& m, double elapsed_s);
  /// The output model directory of a finished stage ("base" = the base model).
  std::string model_dir(const std::string& stage) const;
};

/// The job's tokenizer (model.path's, or the byte tokenizer) and pad id.
struct job_tokenizer_info {
  std::shared_ptr<const models::tokenizer> tok;
  int64_t pad = 0;
};
expected<job_tokenizer_info> job_tokenizer(const model_config& m);

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
                        const inference::rollout_actor& rollout, train::metric_map& m);

/// The trainer → rollout channel of `stage` (weight_sync in the job file).
expected<inference::weight_channel> weight_channel_for(job_context& ctx, const std::string& stage);

/// The trainer publishes its weights as `version` on the stage's channel and
/// the rollout receives and loads them.
expected<void> sync_weights(caf::blocking_actor* self, job_context& ctx, const std::string& stage,
                            const train::engine_actor& trainer,
                            const inference::rollout_actor& rollout, int64_t version);

/// Spawns `role` of `stage` with its model from `model_dir` on the job's
/// host: one engine actor, or the engine group of its DP ranks.
expected<train::engine_actor> spawn_trainer(job_context& ctx, const std::string& stage,
                                            const std::string& role, const std::string& model_dir);
expected<inference::rollout_actor> spawn_rollout_role(job_context& ctx, const std::string& stage,
                                                      const std::string& model_dir);
/// The rl stage's reward role; `model_dir` "" for a rule-only reward.
expected<reward_actor> spawn_reward_role(job_context& ctx, const std::string& model_dir);

/// The rollout engine settings of the job.
inference::engine_config engine_settings(const job_config& cfg);

/// Runs `body` as a detached blocking driver actor and waits for its result.
template <class R>
expected<R> run_driver(caf::actor_system& sys,
                       std::function<expected<R>(caf::blocking_actor*)> body) {
  auto result = std::make_shared<expected<R>>(make_error(errc::internal, "driver did not finish"));
  {
    auto driver = sys.spawn<caf::detached>([result, body](caf::blocking_actor* self) {
      *result = body(self);
    });
    caf::scoped_actor waiter{sys};
    waiter->wait_for(driver);
  }
  return std::move(*result);
}

expected<stage_summary> run_rl_stage(job_context& ctx);

} // namespace troupe::actors::rl::detail
