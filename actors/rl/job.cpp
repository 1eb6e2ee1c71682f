#include "actors/rl/job_internal.hpp"

#include "actors/job/metrics_sink.hpp"
#include "actors/job/tensorboard_sink.hpp"
#include "actors/rl/reward.hpp"
#include "actors/rl/role_traits.hpp"
#include "actors/rl/settings.hpp"
#include "actors/train/engine_group.hpp"
#include "models/chat_template.hpp"
#include "models/config.hpp"
#include "runtime/checkpoint.hpp"
#include "runtime/collectives.hpp"
#include "runtime/compute.hpp"
#include "runtime/file_io.hpp"
#include "runtime/torch_guard.hpp"

#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <chrono>
#include <fstream>
#include <mutex>

#include <unistd.h>

namespace troupe::actors::rl {
namespace detail {

// ---- context ----------------------------------------------------------------

void job_context::metrics(const std::string& stage, int64_t step, int64_t total,
                          const train::metric_map& m, double elapsed_s) const {
  emit(job::metrics_reported{stage, step, total, m});
  if (opts->on_progress)
    opts->on_progress(progress_event{stage, step, total, m, elapsed_s});
}

expected<job::boundary_reply> job_context::boundary(
  const job::boundary_point& p, const std::function<expected<void>()>& checkpoint) const {
  job::boundary_reply out;
  for (;;) {
    auto r = link->boundary(self, p);
    if (!r)
      return r.error();
    out.held_s += r->held_s;
    out.cancel = out.cancel || r->cancel;
    out.now = out.now || r->now;
    out.settings.insert(out.settings.end(), r->settings.begin(), r->settings.end());
    if (r->checkpoint && checkpoint) {
      if (auto ok = checkpoint(); !ok)
        return ok.error();
      out.checkpoint = true;
    }
    if (!r->again)
      break;
  }
  if (opts->stop && opts->stop->load())
    out.cancel = true;
  return out;
}

caf::timespan job_context::timeout_of(request_kind kind) const {
  const auto& t = cfg->run.timeouts;
  double s = t.compute_s;
  switch (kind) {
    case request_kind::control: s = t.control_s; break;
    case request_kind::compute: s = t.compute_s; break;
    case request_kind::generate: s = t.generate_s; break;
    case request_kind::weights: s = t.weights_s; break;
    case request_kind::state: s = t.state_s; break;
  }
  return std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(s));
}

std::string job_context::model_dir(const std::string& stage) const {
  if (stage == "base")
    return base_dir;
  return (run_dir / stage / "model").string();
}

std::mutex& torch_rng_mutex() {
  static std::mutex mu;
  return mu;
}

expected<models::llama_model> load_model(const std::string& dir, models::head_kind head,
                                         bool allow_missing_head, uint64_t seed) {
  std::lock_guard lock{torch_rng_mutex()};
  torch::manual_seed(seed);
  return models::load_pretrained(dir, head, allow_missing_head);
}

caf::error request_error(const caf::error& err, const std::string& what, caf::timespan timeout) {
  if (err == caf::sec::request_timeout)
    return make_error(errc::timeout,
                      what + ": no reply within " +
                          std::to_string(std::chrono::duration<double>(timeout).count()) +
                          " s (run.timeouts)");
  if (err == caf::sec::request_receiver_down)
    return make_error(errc::lost, what + ": the role's actor is down");
  if (err.category() == error_category())
    return with_prefix(err, what);
  return make_error(errc::internal, what + ": " + caf::to_string(err));
}

namespace {

// Shared-memory channels are named after the job's process and the job
// (two jobs in one process do not meet); those of processes that died
// without cleaning up (SIGKILL) are removed at start.
constexpr const char* channel_root = "troupe-job-";

// The default folder of disk-transport versions (removed around each stage).
void remove_default_weight_dir(const job_context& ctx, const std::string& stage) {
  if (ctx.cfg->weight_sync.transport != runtime::transport_kind::disk || !ctx.cfg->weight_sync.dir.empty())
    return;
  std::error_code ec;
  fs::remove_all(ctx.run_dir / stage / "weights", ec);
}

} // namespace

cast make_cast(job_context& ctx, stage_id stage, int rollbacks) {
  cast_env env;
  env.rollbacks = rollbacks;
  env.sys = ctx.sys;
  env.self = ctx.self;
  env.host = ctx.host;
  env.job_yaml = ctx.job_yaml;
  auto stage_name = std::string{to_string(stage)};
  env.layout_of = [plan = &ctx.plan, stage_name](role_id role) {
    return plan->layout_of(stage_name, std::string{to_string(role)});
  };
  env.strategy_of = [plan = &ctx.plan](role_id role) {
    return plan->strategy_of(std::string{to_string(role)});
  };
  env.emit = [link = ctx.link](job::event_body e) { link->emit(std::move(e)); };
  // Bounds the DP group's rendezvous and its collectives inside updates.
  env.group_timeout_ms =
    std::chrono::duration_cast<std::chrono::milliseconds>(ctx.timeout_of(request_kind::compute)).count();
  env.control_timeout = ctx.timeout_of(request_kind::control);
  env.state_timeout = ctx.timeout_of(request_kind::state);
  env.offload_dir = (ctx.run_dir / stage_name / "offload").string();
  return cast{std::move(env), stage};
}

expected<actors::weight_channel> weight_channel_for(job_context& ctx, const std::string& stage) {
  const auto& w = ctx.cfg->weight_sync;
  actors::weight_channel c;
  // The plan chose it for the pair (NOTE [weight transport choice]).
  c.kind = ctx.plan.weight_transport.value_or(runtime::transport_kind::alias);
  c.channel = ctx.channel_prefix + stage;
  c.dir = w.dir.empty() ? (ctx.run_dir / stage / "weights").string() : w.dir;
  c.keep = w.keep;
  c.timeout_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                   ctx.timeout_of(request_kind::weights))
                   .count();
  if (runtime::traits_of(c.kind).needs_group) {
    if (ctx.channel_generation > 0)
      c.channel += ".r" + std::to_string(ctx.channel_generation);
    if (!ctx.weight_store) {
      runtime::store_options so;
      so.host = ctx.host->store_host();
      so.is_server = true;
      so.timeout_ms = c.timeout_ms;
      auto st = runtime::make_tcp_store(so);
      if (!st)
        return with_prefix(st.error(), "weight_sync: the broadcast store");
      auto server = std::make_shared<runtime::store>(std::move(*st));
      ctx.weight_store_addr = so.host + ":" + std::to_string(server->port());
      ctx.weight_store = server;
    }
    c.store = ctx.weight_store_addr;
    c.publisher_host = ctx.host->address_of("policy", 0);
    c.receiver_host = ctx.host->address_of("rollout", 0);
  }
  return c;
}

namespace {

// `now`'s counters on top of `base`'s (a lost rollout's last seen); the
// gauges are `now`'s.
inference::engine_metrics counted_on(const inference::engine_metrics& base,
                                     inference::engine_metrics now) {
  now.steps += base.steps;
  now.prompt_tokens += base.prompt_tokens;
  now.prefill_tokens_computed += base.prefill_tokens_computed;
  now.generated_tokens += base.generated_tokens;
  now.recomputed_tokens += base.recomputed_tokens;
  now.preemptions += base.preemptions;
  now.finished_requests += base.finished_requests;
  now.busy_seconds += base.busy_seconds;
  now.ttft_ms_sum += base.ttft_ms_sum;
  now.itl_ms_sum += base.itl_ms_sum;
  now.itl_count += base.itl_count;
  now.fused_decode_steps += base.fused_decode_steps;
  now.aten_decode_steps += base.aten_decode_steps;
  return now;
}

} // namespace

std::vector<inference::request_output> take_generation(job_context& ctx, inference::generation&& g) {
  auto seen = counted_on(ctx.rollout_base, std::move(g.engine));
  if (seen.steps >= ctx.rollout_seen.steps)
    ctx.rollout_seen = std::move(seen);
  return std::move(g.outputs);
}

episode_options episode_options_of(const job_context& ctx, int64_t step) {
  const auto& cfg = *ctx.cfg;
  const auto& e = cfg.rl.environment;
  episode_options o;
  o.max_turns = e.max_turns;
  o.max_context = cfg.rl.rollout.max_model_len > 0
                      ? std::min(cfg.rl.rollout.max_model_len, ctx.model_context)
                      : ctx.model_context;
  if (e.max_context > 0)
    o.max_context = std::min(o.max_context, e.max_context);
  o.tool_format = models::tool_call_format::hermes;
  if (e.tool_call_format)
    o.tool_format = *e.tool_call_format;
  else if (auto chat = ctx.tok->chat())
    if (auto f = models::tool_call_format_of_template((*chat)->source()))
      o.tool_format = *f;
  o.timeout_s = e.timeout_s;
  o.generate_timeout_s =
      std::chrono::duration<double>(ctx.timeout_of(request_kind::generate)).count();
  o.threads = e.threads;
  o.overlap = e.overlap;
  o.job = cfg.run.name;
  o.step = step;
  return o;
}

expected<std::vector<inference::request_output>> generate(job_context& ctx,
                                                           const inference::rollout_actor& rollout,
                                                           std::vector<inference::generate_request> reqs,
                                                           const std::string& what) {
  auto g = ask<inference::generation>(ctx.self, rollout, ctx.timeout_of(request_kind::generate), what,
                                      inference::generate_atom::value, std::move(reqs));
  if (!g)
    return g.error();
  return take_generation(ctx, std::move(*g));
}

expected<void> sync_weights(caf::blocking_actor* self, job_context& ctx, const std::string& stage,
                            const train::engine_actor& trainer,
                            const inference::rollout_actor& rollout, int64_t version) {
  stopwatch clock;
  auto ch = weight_channel_for(ctx, stage);
  if (!ch)
    return ch.error();
  const auto& channel = *ch;
  expected<actors::sync_bytes> sent = make_error(errc::internal, "no reply"), got = sent;
  if (runtime::traits_of(channel.kind).both_ends_at_once) {
    // A collective: both ends must be in it at once (NOTE [transport traits]).
    auto p = self->request(trainer, ctx.timeout_of(request_kind::weights), train::publish_atom::value, version, channel);
    auto r = self->request(rollout, ctx.timeout_of(request_kind::weights), inference::receive_weights_atom::value, version, channel);
    p.receive(
        [&](train::served_sync& b) {
          ctx.roles_busy_s += b.busy_s;
          sent = b.value;
        },
        [&](caf::error& e) {
          sent = request_error(e, "policy: publish weights", ctx.timeout_of(request_kind::weights));
        });
    r.receive([&](actors::sync_bytes& b) { got = b; },
              [&](caf::error& e) {
                got = request_error(e, "rollout: receive weights",
                                    ctx.timeout_of(request_kind::weights));
              });
  } else {
    sent = ask_served<actors::sync_bytes>(ctx, trainer, request_kind::weights,
                                          "policy: publish weights", train::publish_atom::value,
                                          version, channel);
    if (sent)
      got = receive_weights(self, ctx, stage, rollout, version);
  }
  if (sent)
    ctx.published[stage] = version;
  // NOTE [the cause first]: a rollout lost inside the collective fails the
  // policy's side of it too; the loss explains both.
  if (!got && code_of(got.error()) == errc::lost)
    return got.error();
  if (!sent)
    return sent.error();
  if (!got)
    return got.error();
  if (got->bytes != sent->bytes)
    return make_error(errc::corrupted, "weight sync " + std::to_string(version) + ": " +
                                           std::to_string(sent->bytes) + " bytes published, " +
                                           std::to_string(got->bytes) + " received");
  ctx.emit(job::weight_synced{stage, version, std::string{to_string(channel.kind)}, got->bytes,
                              clock.seconds(), std::string{to_string(role_id::policy)},
                              std::string{to_string(role_id::rollout)}, sent->temporary,
                              got->temporary});
  return {};
}

expected<actors::sync_bytes> receive_weights(caf::blocking_actor* self, job_context& ctx,
                                             const std::string& stage,
                                             const inference::rollout_actor& rollout,
                                             int64_t version) {
  auto ch = weight_channel_for(ctx, stage);
  if (!ch)
    return ch.error();
  if (runtime::traits_of(ch->kind).both_ends_at_once)
    return make_error(errc::unsupported,
                      "rollout: receive weights: a weight_sync transport of kind " +
                          std::string{to_string(ch->kind)} +
                          " meets its ends in a collective, which a restarted rollout cannot "
                          "join yet");
  return ask<actors::sync_bytes>(self, rollout, ctx.timeout_of(request_kind::weights),
                                 "rollout: receive weights", inference::receive_weights_atom::value,
                                 version, *ch);
}

namespace {

// One evaluation pass over the held-out prompts: `samples` responses per
// prompt at `temperature` (0 = greedy), seeds fixed per prompt so every
// evaluation of the same weights gives the same number.
// A few held-out (prompt, response, score) triples of a pass, as an event.
// With episodes, each sample's conversation goes along (`conversations`,
// else empty).
void emit_samples(job_context& ctx, const std::string& stage, int64_t step,
                  const std::vector<std::vector<int64_t>>& responses,
                  const std::vector<double>& scores, int64_t per_prompt,
                  const std::vector<std::string>& conversations) {
  job::eval_samples ev{stage, step, {}};
  const auto& eval = ctx.data.eval;
  for (size_t i = 0; i < std::min<size_t>(3, eval.size()); ++i) {
    auto k = i * static_cast<size_t>(per_prompt);
    if (k >= responses.size())
      break;
    auto text = ctx.tok->decode(responses[k]);
    ev.samples.push_back({eval[i].prompt, text ? *text : std::string{}, scores[k],
                          k < conversations.size() ? conversations[k] : std::string{}});
  }
  ctx.emit(std::move(ev));
}

// What a held-out pass generated: per sample, the response the rules score
// (with episodes: the last turn) and the whole response (for the samples
// shown), and the environment's rewards (empty without one).
struct eval_outputs {
  std::vector<std::vector<int64_t>> scored, shown;
  std::vector<std::string> answers;
  std::vector<double> env_rewards;
  /// Each episode's transcript as JSON (empty without episodes).
  std::vector<std::string> conversations;
  double length = 0;
};

// NOTE [episodes]: the held-out prompts as episodes with the job's
// environment; its metrics under `prefix` + "env/...".
expected<eval_outputs> eval_episodes(job_context& ctx, const inference::rollout_actor& rollout,
                                     std::vector<inference::generate_request> reqs,
                                     const std::string& prefix, train::metric_map& m,
                                     int64_t step) {
  const auto& eval = ctx.data.eval;
  std::vector<episode_prompt> prompts;
  for (size_t i = 0; i < reqs.size(); ++i)
    prompts.push_back({reqs[i].id, eval[i], reqs[i].sampling});
  auto got =
      run_episodes(*ctx.sys, rollout, ctx.env, ctx.enc, prompts, episode_options_of(ctx, step));
  if (!got)
    return with_prefix(got.error(), "evaluation");
  inference::generation seen{{}, got->stats.engine};
  (void)take_generation(ctx, std::move(seen));
  for (auto& [k, v] : episode_metrics(*got))
    m[prefix + k] = v;
  eval_outputs out;
  const auto n = static_cast<size_t>(std::max<int32_t>(1, reqs.front().sampling.n));
  for (size_t i = 0; i < got->episodes.size(); ++i) {
    auto& ep = got->episodes[i];
    out.length +=
        static_cast<double>(ep.tokens.size() - static_cast<size_t>(ep.observation_tokens));
    out.scored.emplace_back(ep.tokens.begin() + static_cast<long>(ep.last_turn_begin),
                            ep.tokens.end());
    out.shown.push_back(std::move(ep.tokens));
    out.answers.push_back(eval[i / n].answer);
    out.env_rewards.push_back(ep.reward);
    out.conversations.push_back(
        ep.transcript.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
  }
  return out;
}

expected<eval_outputs> eval_responses(job_context& ctx, const inference::rollout_actor& rollout,
                                      std::vector<inference::generate_request> reqs) {
  const auto& eval = ctx.data.eval;
  auto outs = generate(ctx, rollout, std::move(reqs), "rollout: evaluation");
  if (!outs)
    return outs.error();
  eval_outputs out;
  for (size_t i = 0; i < outs->size(); ++i)
    for (auto& s : (*outs)[i].samples) {
      out.length += static_cast<double>(s.tokens.size());
      out.scored.push_back(s.tokens);
      out.shown.push_back(std::move(s.tokens));
      out.answers.push_back(eval[i].answer);
    }
  return out;
}

expected<void> evaluate_pass(job_context& ctx, const inference::rollout_actor& rollout, double temperature,
                             int64_t samples, const std::string& prefix, train::metric_map& m,
                             const std::string& stage, int64_t step) {
  const auto& eval = ctx.data.eval;
  std::vector<inference::generate_request> reqs;
  reqs.reserve(eval.size());
  for (size_t i = 0; i < eval.size(); ++i) {
    inference::generate_request r;
    r.id = "eval-" + std::to_string(i);
    r.prompt = value_or_throw(ctx.enc.prompt(eval[i].prompt, eval[i].messages));
    r.sampling.temperature = temperature;
    r.sampling.n = static_cast<int32_t>(samples);
    r.sampling.max_tokens = ctx.cfg->rl.generation.max_tokens;
    r.sampling.seed = mix_seed({static_cast<uint64_t>(ctx.cfg->run.seed), 71, i});
    reqs.push_back(std::move(r));
  }
  auto outs = ctx.env ? eval_episodes(ctx, rollout, std::move(reqs), prefix, m, step)
                      : eval_responses(ctx, rollout, std::move(reqs));
  if (!outs)
    return outs.error();
  auto rules = rule_set::make(reward_rules(ctx.cfg->rl.reward), ctx.cfg->rl.generation.max_tokens);
  if (!rules)
    return with_prefix(rules.error(), "rl.reward");
  auto outcome = apply_rules(*ctx.tok, *rules, outs->scored, outs->answers);
  if (!outcome)
    return outcome.error();
  // NOTE [episodes]: an episode's score is as rl.environment.score says.
  auto scores = outcome->scores;
  if (ctx.env && ctx.cfg->rl.environment.score != episode_score::reward)
    for (size_t i = 0; i < scores.size(); ++i)
      scores[i] = outs->env_rewards[i] +
                  (ctx.cfg->rl.environment.score == episode_score::sum ? scores[i] : 0.0);
  const double length = outs->length;
  double sum = 0, hits = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    sum += scores[i];
    hits += outcome->correct[i];
  }
  auto n = static_cast<double>(std::max<size_t>(1, scores.size()));
  if (prefix == "val/")
    emit_samples(ctx, stage, step, outs->shown, scores, samples, outs->conversations);
  m[prefix + "score/mean"] = sum / n;
  m[prefix + "accuracy"] = hits / n;
  if (!outcome->formatted.empty()) { // the share in the answer format (format rules)
    double formatted = 0;
    for (auto f : outcome->formatted)
      formatted += f;
    m[prefix + "format_rate"] = formatted / n;
  }
  m[prefix + "response_length/mean"] = length / n;
  return {};
}

} // namespace

expected<void> evaluate(caf::blocking_actor* self, job_context& ctx,
                        const inference::rollout_actor& rollout, train::metric_map& m,
                        const std::string& stage, int64_t step) {
  const auto& r = ctx.cfg->rl;
  if (r.eval_temperature > 0) {
    if (auto ok = evaluate_pass(ctx, rollout, r.eval_temperature, r.eval_samples, "val/", m, stage, step);
        !ok)
      return ok;
    if (auto ok = evaluate_pass(ctx, rollout, 0, 1, "val/greedy/", m, stage, step); !ok)
      return ok;
  } else {
    if (auto ok = evaluate_pass(ctx, rollout, 0, 1, "val/", m, stage, step); !ok)
      return ok;
  }
  // Evaluation prompts must not leave cached prefixes behind: the next
  // training batch then computes the same whether or not an evaluation ran
  // before it (a resumed run has not run it).
  auto cleared = ask<int64_t>(self, rollout, ctx.timeout_of(request_kind::control), "rollout: clear cache",
                              inference::clear_cache_atom::value);
  if (!cleared)
    return cleared.error();
  return {};
}

expected<void> commit_checkpoint(job_context& ctx, const std::string& stage, int64_t step,
                                 const char* prefix, const runtime::checkpoint_files& files) {
  stopwatch clock;
  char name[32];
  std::snprintf(name, sizeof name, "%s_%08lld", prefix, static_cast<long long>(step));
  auto parent = (ctx.run_dir / stage / "checkpoints").string();
  if (auto ok = runtime::write_checkpoint(parent, name, files); !ok)
    return ok;
  int64_t bytes = 0;
  for (const auto& [file, data] : files)
    bytes += static_cast<int64_t>(data.size());
  ctx.emit(job::checkpoint_saved{stage, step, parent + "/" + name, bytes, clock.seconds()});
  ctx.log->info(stage + ": checkpoint " + name + " (" + std::to_string(bytes) + " bytes)");
  return {};
}

// NOTE [sharded checkpoints].
expected<void> save_role_state(job_context& ctx, const train::engine_actor& trainer,
                               const std::string& role, const std::string& name,
                               runtime::checkpoint_files& files) {
  auto saved = ask<train::state_shards>(ctx.self, trainer, ctx.timeout_of(request_kind::state),
                                        role + ": save state", train::save_shards_atom::value);
  if (!saved)
    return saved.error();
  auto& shards = saved->shards;
  for (size_t r = 0; r < shards.size(); ++r)
    files[name + ".shard-" + std::to_string(r)] = std::move(shards[r]);
  const auto* placed = ctx.plan.find(role);
  nlohmann::json j = {{"shards", shards.size()},
                      {"strategy", to_string(ctx.plan.strategy_of(role))},
                      {"dp", placed ? placed->layout.dp : 1},
                      {"tp", placed ? placed->layout.tp : 1},
                      {"pp", placed ? placed->layout.pp : 1}};
  files[name + ".shards.json"] = j.dump() + "\n";
  return {};
}

bool has_role_state(const runtime::checkpoint_files& files, const std::string& name) {
  return files.count(name + ".shards.json") || files.count(name + ".state");
}

expected<void> load_role_state(job_context& ctx, const train::engine_actor& trainer,
                               const std::string& name, const runtime::checkpoint_files& files,
                               const std::string& dir) {
  const auto what = dir + ": " + name + ": load state";
  if (!files.count(name + ".shards.json")) { // an earlier version's whole state
    if (!files.count(name + ".state"))
      return make_error(errc::corrupted, dir + ": no state of " + name);
    auto ok = ask<int64_t>(ctx.self, trainer, ctx.timeout_of(request_kind::state), what,
                           train::load_state_atom::value, files.at(name + ".state"));
    return ok ? expected<void>{} : expected<void>{ok.error()};
  }
  auto j = nlohmann::json::parse(files.at(name + ".shards.json"), nullptr, false);
  if (j.is_discarded() || !j.contains("shards") || !j["shards"].is_number_unsigned())
    return make_error(errc::corrupted, dir + ": " + name + ".shards.json is malformed");
  train::state_shards shards;
  shards.tp = j.contains("tp") && j["tp"].is_number_integer() ? j["tp"].get<int32_t>() : 1;
  shards.pp = j.contains("pp") && j["pp"].is_number_integer() ? j["pp"].get<int32_t>() : 1;
  for (size_t r = 0; r < j["shards"].get<size_t>(); ++r) {
    auto it = files.find(name + ".shard-" + std::to_string(r));
    if (it == files.end())
      return make_error(errc::corrupted, dir + ": " + name + ".shard-" + std::to_string(r) +
                                             " is missing (" + name + ".shards.json names " +
                                             std::to_string(j["shards"].get<size_t>()) + ")");
    shards.shards.push_back(it->second);
  }
  auto ok = ask<int64_t>(ctx.self, trainer, ctx.timeout_of(request_kind::state), what,
                         train::load_shards_atom::value, std::move(shards));
  return ok ? expected<void>{} : expected<void>{ok.error()};
}

namespace {

// ---- checkpoints of the SFT / RM stages --------------------------------------

expected<void> save_stage_checkpoint(caf::blocking_actor* self, job_context& ctx,
                                     const std::string& stage, const train::engine_actor& trainer,
                                     int64_t step) {
  (void)self;
  std::string role; // the role the stage trains (the stage table's)
  if (const auto* st = find_stage(stage))
    for (const auto& t : all_roles())
      if (t.trains_in(st->id) && in_cast(st->id, t.id, *ctx.cfg))
        role = std::string{t.name};
  runtime::checkpoint_files files;
  if (auto ok = save_role_state(ctx, trainer, role, "model", files); !ok)
    return ok;
  files["driver.json"] = nlohmann::json{{"stage", stage}, {"step", step}}.dump() + "\n";
  return commit_checkpoint(ctx, stage, step, "step", files);
}

/// Restores the latest checkpoint of `stage` into `engine`; returns its step (0 without one).
// Where a supervised stage resumes: its step, and the training state to
// load (none for a fresh start).
struct stage_start {
  int64_t step = 0;
  std::optional<runtime::checkpoint_files> files; // holding "model"'s state
  std::string dir;
};

expected<stage_start> restore_stage(job_context& ctx, const std::string& stage) {
  if (!ctx.opts->resume)
    return stage_start{};
  auto dir = runtime::latest_checkpoint((ctx.run_dir / stage / "checkpoints").string());
  if (!dir)
    return code_of(dir.error()) == errc::not_found ? expected<stage_start>{stage_start{}}
                                                    : expected<stage_start>{dir.error()};
  auto files = runtime::read_checkpoint(*dir);
  if (!files)
    return files.error();
  if (!has_role_state(*files, "model") || !files->count("driver.json"))
    return make_error(errc::corrupted, *dir + ": not a " + stage + " checkpoint");
  auto j = nlohmann::json::parse(files->at("driver.json"), nullptr, false);
  if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer())
    return make_error(errc::corrupted, *dir + ": driver.json is malformed");
  const auto step = j["step"].get<int64_t>();
  return stage_start{step, std::move(*files), *dir};
}

expected<void> mark_done(job_context& ctx, const stage_summary& s) {
  nlohmann::json j = {{"stage", s.stage}, {"steps", s.steps}, {"output", s.output}};
  for (const auto& [k, v] : s.metrics)
    if (std::isfinite(v))
      j["metrics"][k] = v;
  return runtime::write_file_atomic((ctx.run_dir / s.stage / "done").string(), j.dump(2) + "\n");
}

expected<stage_summary> read_done(job_context& ctx, const std::string& stage) {
  auto text = runtime::read_file((ctx.run_dir / stage / "done").string());
  if (!text)
    return text.error();
  auto j = nlohmann::json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return make_error(errc::corrupted, (ctx.run_dir / stage / "done").string() + ": malformed");
  stage_summary s;
  s.stage = stage;
  s.skipped = true;
  const auto malformed = [&] {
    return make_error(errc::corrupted, (ctx.run_dir / stage / "done").string() + ": malformed");
  };
  if ((j.contains("steps") && !j["steps"].is_number_integer()) ||
      (j.contains("output") && !j["output"].is_string()) ||
      (j.contains("metrics") && !j["metrics"].is_object()))
    return malformed();
  s.steps = j.value("steps", int64_t{0});
  s.output = j.value("output", std::string{});
  if (j.contains("metrics"))
    for (const auto& [k, v] : j["metrics"].items()) {
      if (!v.is_number())
        return malformed();
      s.metrics[k] = v.get<double>();
    }
  return s;
}

// ---- SFT and RM drivers -------------------------------------------------------

// Preference pairs as chosen / rejected sequences (prompt + response + EOS).
expected<runtime::tensor_batch> pair_batch(job_context& ctx, const std::vector<preference_pair>& rows) {
  std::vector<std::vector<int64_t>> chosen, rejected;
  for (const auto& p : rows) {
    auto prompt = value_or_throw(ctx.enc.prompt(p.prompt, p.messages));
    auto c = ctx.enc.response(p.chosen);
    auto r = ctx.enc.response(p.rejected);
    chosen.push_back(prompt);
    chosen.back().insert(chosen.back().end(), c.begin(), c.end());
    rejected.push_back(prompt);
    rejected.back().insert(rejected.back().end(), r.begin(), r.end());
  }
  return collate_pairs(chosen, rejected, ctx.pad);
}

// One SFT step's demonstrations.
expected<runtime::tensor_batch> sft_batch(job_context& ctx, int64_t step) {
  const auto n = ctx.cfg->sft.batch_size;
  auto seed = mix_seed({static_cast<uint64_t>(ctx.cfg->run.seed), 11u});
  auto rows = ctx.data.sft.rows(batch_indices(ctx.data.sft.size(), seed, step * n, n));
  if (!rows)
    return rows.error();
  std::vector<std::vector<int64_t>> prompts, responses;
  std::vector<std::vector<float>> masks; // NOTE [demonstration turns]
  bool multi_turn = false;
  const auto format = episode_options_of(ctx, 0).tool_format;
  for (const auto& row : *rows) {
    if (!row.turns.empty()) {
      auto d = render_demonstration(ctx.enc, row, format);
      if (!d)
        return d.error();
      prompts.push_back(std::move(d->prompt));
      responses.push_back(std::move(d->tokens));
      masks.push_back(std::move(d->loss_mask));
      multi_turn = true;
      continue;
    }
    auto prompt = ctx.enc.prompt(row.prompt, row.messages);
    if (!prompt)
      return prompt.error();
    prompts.push_back(std::move(*prompt));
    responses.push_back(ctx.enc.response(row.response));
    masks.emplace_back(responses.back().size(), 1.0f);
  }
  auto batch = collate_sequences(prompts, responses, ctx.pad);
  if (!batch || !multi_turn)
    return batch;
  // The tools' answers carry no loss.
  auto mask = value_or_throw(batch->get("response_mask"));
  auto masked = mask * scatter_response_values(prompts, masks, mask.size(1) + 1);
  if (auto ok = batch->set("response_mask", masked); !ok)
    return ok.error();
  return batch;
}

// One RM step's preference pairs.
expected<runtime::tensor_batch> rm_batch(job_context& ctx, int64_t step) {
  auto picked = ctx.data.preferences.rows(
      preference_indices(*ctx.cfg, ctx.data, 12u, step, ctx.cfg->rm.batch_size));
  if (!picked)
    return picked.error();
  return pair_batch(ctx, *picked);
}

// SFT: a next-token step; evaluation publishes the weights to the rollout
// and answers the held-out prompts.
expected<stage_steps> sft_steps(job_context& ctx, const cast& roles) {
  auto trainer = roles.handle_as<train::engine_actor>(role_id::policy);
  auto rollout = roles.handle_as<inference::rollout_actor>(role_id::rollout);
  stage_steps out;
  out.train = [&ctx, trainer](int64_t step) -> expected<train::metric_map> {
    auto batch = sft_batch(ctx, step);
    if (!batch)
      return batch.error();
    auto m = ask<train::metric_map>(ctx.self, trainer, ctx.timeout_of(request_kind::compute),
                                    "policy: sft step", train::sft_step_atom::value, *batch);
    if (m && step == 0) // NOTE [prefix check]
      (*m)["data/template_divergences"] = static_cast<double>(ctx.data.template_divergences);
    return m;
  };
  out.evaluate = [&ctx, trainer, rollout](train::metric_map& m, int64_t step) -> expected<void> {
    if (auto ok = sync_weights(ctx.self, ctx, "sft", trainer, rollout, step + 1); !ok)
      return ok;
    return evaluate(ctx.self, ctx, rollout, m, "sft", step + 1);
  };
  return out;
}

// RM: a Bradley–Terry step; evaluation is the held-out pairwise accuracy.
expected<stage_steps> rm_steps(job_context& ctx, const cast& roles) {
  auto trainer = roles.handle_as<train::engine_actor>(role_id::reward);
  auto eval_pairs = pair_batch(ctx, ctx.data.eval_preferences);
  if (!eval_pairs)
    return eval_pairs.error();
  stage_steps out;
  out.train = [&ctx, trainer](int64_t step) -> expected<train::metric_map> {
    auto batch = rm_batch(ctx, step);
    if (!batch)
      return batch.error();
    return ask<train::metric_map>(ctx.self, trainer, ctx.timeout_of(request_kind::compute),
                                  "reward: rm step", train::rm_step_atom::value, *batch);
  };
  out.evaluate = [&ctx, trainer, pairs = std::move(*eval_pairs)](train::metric_map& m,
                                                                 int64_t) -> expected<void> {
    auto e = ask<train::metric_map>(ctx.self, trainer, ctx.timeout_of(request_kind::compute),
                                    "reward: rm eval", train::rm_eval_atom::value, pairs);
    if (!e)
      return e.error();
    m.insert(e->begin(), e->end());
    return {};
  };
  return out;
}

// One optimizer step of a supervised stage, with its evaluation and checkpoint.
expected<train::metric_map> supervised_step(job_context& ctx, const supervised_stage& st,
                                            const stage_steps& steps,
                                            const train::engine_actor& trainer, int64_t step) {
  auto m = steps.train(step);
  if (!m)
    return m.error();
  bool last = step + 1 == st.steps;
  if (!last && !(st.eval_every > 0 && (step + 1) % st.eval_every == 0))
    return m;
  if (auto ok = steps.evaluate(*m, step); !ok)
    return ok.error();
  if (!last)
    if (auto ok = save_stage_checkpoint(ctx.self, ctx, st.name, trainer, step + 1); !ok)
      return ok.error();
  return m;
}

} // namespace

expected<stage_summary> run_supervised(job_context& ctx, const supervised_stage& st,
                                       const make_steps_fn& make_steps) {
  stopwatch clock;
  auto* self = ctx.self;
  auto start = restore_stage(ctx, st.name);
  if (!start)
    return start.error();
  ctx.emit(job::stage_started{st.name, st.steps, start->step});
  // The stage's cast (NOTE [stage table]): every role from the stage's start.
  auto roles = make_cast(ctx, st.id);
  for (auto role : stage_cast(st.id, *ctx.cfg))
    if (auto ok = roles.spawn(role, st.init_dir); !ok)
      return ok.error();
  auto trainer = roles.handle_as<train::engine_actor>(st.trainer);
  auto finish = [&](expected<stage_summary> r) {
    roles.stop();
    return r;
  };
  auto steps = make_steps(ctx, roles);
  if (!steps)
    return finish(steps.error());
  stage_summary sum;
  sum.stage = st.name;
  sum.output = ctx.model_dir(st.name);
  if (start->files)
    if (auto loaded = load_role_state(ctx, trainer, "model", *start->files, start->dir); !loaded)
      return finish(loaded.error());
  for (int64_t step = start->step; step < st.steps; ++step) {
    // Every step boundary is consistent: the trainer holds step `step`.
    auto orders = ctx.boundary({st.name, step + 1, "", true}, [&] {
      return save_stage_checkpoint(self, ctx, st.name, trainer, step);
    });
    if (!orders)
      return finish(orders.error());
    if (orders->cancel) {
      if (!orders->now && !orders->checkpoint)
        if (auto ok = save_stage_checkpoint(self, ctx, st.name, trainer, step); !ok)
          return finish(ok.error());
      sum.steps = step;
      sum.stopped = true;
      return finish(sum);
    }
    ctx.emit(job::phase_started{st.name, step + 1, "train"});
    stopwatch t;
    auto m = supervised_step(ctx, st, *steps, trainer, step);
    ctx.emit(job::phase_finished{st.name, step + 1, "train", t.seconds(), static_cast<bool>(m)});
    if (!m)
      return finish(m.error());
    (*m)["training/global_step"] = static_cast<double>(step + 1);
    ctx.metrics(st.name, step + 1, st.steps, *m, clock.seconds());
    sum.metrics = *m;
    sum.steps = step + 1;
  }
  auto saved = ask<std::string>(self, trainer, ctx.timeout_of(request_kind::state), st.name + ": save model",
                                train::save_model_atom::value, sum.output);
  if (!saved)
    return finish(saved.error());
  return finish(sum);
}

std::vector<int64_t> preference_indices(const job_config& cfg, const job_data& data, uint64_t salt,
                                        int64_t step, int64_t batch_size) {
  auto seed = mix_seed({static_cast<uint64_t>(cfg.run.seed), salt});
  return batch_indices(data.preferences.size(), seed, step * batch_size, batch_size);
}

namespace {

// ---- the base model -------------------------------------------------------------

expected<void> prepare_base(job_context& ctx) {
  const auto& m = ctx.cfg->model;
  auto tok = job_tokenizer(m);
  if (!tok)
    return tok.error();
  ctx.tok = tok->tok;
  ctx.pad = tok->pad;
  if (!m.path.empty()) {
    ctx.base_dir = m.path;
    return {};
  }
  ctx.base_dir = (ctx.run_dir / "base" / "model").string();
  if (fs::exists(fs::path{ctx.base_dir} / "config.json"))
    return {}; // a resumed run keeps its base model
  models::llama_config c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = models::byte_tokenizer::size;
  c.hidden_size = m.hidden_size;
  c.intermediate_size = m.intermediate_size;
  c.num_hidden_layers = m.num_layers;
  c.num_attention_heads = m.num_heads;
  c.num_key_value_heads = m.num_kv_heads;
  c.max_position_embeddings = m.max_position_embeddings;
  c.rope_theta = m.rope_theta;
  c.bos_token_id = models::byte_tokenizer::bos_token;
  c.eos_token_ids = {models::byte_tokenizer::eos_token};
  c.pad_token_id = models::byte_tokenizer::pad_token;
  // torch's RNG is process-global: two jobs in one process take turns.
  std::lock_guard lock{torch_rng_mutex()};
  torch::manual_seed(mix_seed({static_cast<uint64_t>(ctx.cfg->run.seed), 31}));
  auto model = models::make_llama(c, models::head_kind::lm);
  if (!model)
    return with_prefix(model.error(), "model");
  return models::save_pretrained(*model, ctx.base_dir);
}

// The stage configuration of sft / rm.
supervised_stage supervised_of(const job_context& ctx, stage_id stage) {
  const auto& cfg = *ctx.cfg;
  supervised_stage st;
  st.id = stage;
  st.name = std::string{to_string(stage)};
  if (stage == stage_id::sft) {
    st.steps = cfg.sft.steps;
    st.eval_every = cfg.sft.eval_every;
    st.init_dir = ctx.base_dir;
  } else {
    st.steps = cfg.rm.steps;
    st.eval_every = cfg.rm.eval_every;
    st.trainer = role_id::reward;
    st.init_dir = ctx.model_dir(std::string{to_string(cfg.rm.init)});
  }
  return st;
}

// NOTE [prefix check]: a template that is not append-only is reported (the
// log, data/template_divergences) and refused only when the job would
// re-render conversations (data.retokenize).
expected<void> check_template_prefixes(job_context& ctx) {
  if (!ctx.tok->chat())
    return {};
  auto report = check_prefixes(ctx.enc, ctx.cfg->data, ctx.data);
  if (!report)
    return report.error();
  ctx.data.template_divergences = report->divergent;
  if (report->divergent == 0)
    return {};
  auto what = "the chat template is not append-only in " + std::to_string(report->divergent) +
              " of " + std::to_string(report->checked) + " conversations checked; " + report->first;
  if (ctx.cfg->data.retokenize)
    return make_error(errc::invalid_config,
                      "data.retokenize: re-rendering would change tokens already generated: " +
                          what);
  ctx.log->warn(what + " (token ids are extended, never re-rendered: harmless unless a "
                       "feature re-renders, which data.retokenize: true refuses)");
  return {};
}

// The job's rows (NOTE [dataset files]), measured with its tokenizer: rows
// that cannot fit the context are dropped, and the log says how many.
expected<void> prepare_data(job_context& ctx) {
  const auto& cfg = *ctx.cfg;
  ctx.enc = prompt_encoder{ctx.tok, cfg.data.chat_template};
  data_limits limits;
  limits.prompt_tokens = [enc = ctx.enc](const std::string& prompt,
                                         const std::string& messages) -> expected<int64_t> {
    auto ids = enc.prompt(prompt, messages);
    if (!ids)
      return ids.error();
    return static_cast<int64_t>(ids->size());
  };
  limits.response_tokens = [enc = ctx.enc](const std::string& response) {
    return static_cast<int64_t>(enc.response(response).size());
  };
  limits.demonstration_tokens = [enc = ctx.enc, format = episode_options_of(ctx, 0).tool_format](
                                    const demonstration& d) -> expected<int64_t> {
    auto t = render_demonstration(enc, d, format);
    if (!t)
      return t.error();
    return static_cast<int64_t>(t->prompt.size() + t->tokens.size());
  };
  auto shape = models::load_hf_config(ctx.base_dir + "/config.json");
  if (!shape)
    return shape.error();
  limits.context = shape->max_position_embeddings;
  ctx.model_context = shape->max_position_embeddings;
  limits.max_new_tokens = cfg.rl.generation.max_tokens;
  auto data = load_job_data(cfg.data, limits,
                            {has_stage(cfg, "sft"), has_stage(cfg, "rm") || has_stage(cfg, "dpo")});
  if (!data)
    return data.error();
  ctx.data = std::move(*data);
  for (const auto& note : ctx.data.notes)
    ctx.log->warn(note);
  return check_template_prefixes(ctx);
}

// The run directory, threads, data, base model and config.yaml.
expected<void> prepare(job_context& ctx) {
  const auto& cfg = *ctx.cfg;
  auto link = ctx.link;
  auto log = runtime::job_logger::open(
    cfg.run.name, (ctx.run_dir / "troupe.log").string(), cfg.run.log_level,
    [link](runtime::log_level l, const std::string& text) {
      link->log(std::string{runtime::to_string(l)}, text);
    });
  if (!log)
    return log.error();
  ctx.log = std::move(*log);
  ctx.log->info("job " + cfg.run.name + (ctx.opts->resume ? ": resuming in " : ": starting in ") +
                ctx.run_dir.string());
  for (const auto& w : ctx.plan.warnings)
    ctx.log->warn(w);
  runtime::set_compute_threads(static_cast<int>(cfg.run.threads));
  if (auto ok = prepare_base(ctx); !ok)
    return ok;
  if (auto ok = prepare_data(ctx); !ok)
    return ok;
  if (auto ok = runtime::write_file_atomic((ctx.run_dir / "config.yaml").string(), ctx.job_yaml);
      !ok)
    return ok;
  runtime::remove_orphaned_shm_segments(channel_root);
  return {};
}

// The driver of each row of the stage table (NOTE [stage table]).
expected<stage_summary> drive(stage_id id, job_context& ctx) {
  switch (id) {
  case stage_id::sft:
    return run_sft_stage(ctx);
  case stage_id::rm:
    return run_rm_stage(ctx);
  case stage_id::dpo:
    return run_dpo_stage(ctx);
  case stage_id::rl:
    return run_rl_stage(ctx);
  }
  return make_error(errc::invalid_config, "stage " + std::to_string(static_cast<int>(id)));
}

expected<stage_summary> run_stage(job_context& ctx, const std::string& stage) {
  remove_default_weight_dir(ctx, stage);
  ctx.log->info(stage + ": starting");
  const auto* row = find_stage(stage); // checked with the job file
  auto s =
      row ? drive(row->id, ctx) : make_error(errc::invalid_config, "unknown stage '" + stage + "'");
  remove_default_weight_dir(ctx, stage);
  if (!s)
    return s;
  ctx.log->info(stage + (s->stopped ? ": stopped after " : ": finished, ") +
                std::to_string(s->steps) + " steps");
  return s;
}

// The driver: prepares the job, then runs its stages in order.
expected<job_summary> drive_job(job_context& ctx) {
  if (auto ok = prepare(ctx); !ok)
    return ok.error();
  ctx.link->prepared();
  job_summary summary;
  summary.run_dir = ctx.run_dir.string();
  std::error_code ec;
  const auto stages = ctx.cfg->stages; // a copy: runtime settings replace ctx.live
  for (const auto& stage : stages) {
    if (ctx.opts->resume && fs::exists(ctx.run_dir / stage / "done", ec)) {
      auto s = read_done(ctx, stage);
      if (!s)
        return s.error();
      summary.stages.push_back(std::move(*s));
      continue;
    }
    stopwatch clock;
    auto s = run_stage(ctx, stage);
    if (!s)
      return s.error();
    s->seconds = clock.seconds();
    ctx.emit(job::stage_finished{stage, s->steps, s->seconds, s->stopped});
    summary.stages.push_back(*s);
    if (s->stopped) {
      summary.stopped = true;
      return summary;
    }
    if (auto ok = mark_done(ctx, *s); !ok)
      return ok.error();
  }
  return summary;
}

std::string next_job_id() {
  static std::atomic<int64_t> next{1};
  return std::to_string(::getpid()) + "-" + std::to_string(next++);
}

// Refusals before anything is spawned; creates the run directory.
expected<fs::path> check_run_dir(const job_config& cfg, const run_options& opts) {
  std::error_code ec;
  auto dir = fs::absolute(cfg.run.dir, ec);
  auto metrics_path = dir / "metrics.jsonl";
  if (!opts.resume && fs::exists(metrics_path, ec) && fs::file_size(metrics_path, ec) > 0)
    return make_error(errc::invalid_argument,
                      "run.dir " + dir.string() +
                        " already holds a run: pass --resume to continue it, or choose another "
                        "run.dir");
  fs::create_directories(dir, ec);
  if (ec)
    return make_error(errc::io_error, "cannot create " + dir.string() + ": " + ec.message());
  return dir;
}

} // namespace

expected<stage_summary> run_sft_stage(job_context& ctx) {
  return run_supervised(ctx, supervised_of(ctx, stage_id::sft), sft_steps);
}

expected<stage_summary> run_rm_stage(job_context& ctx) {
  return run_supervised(ctx, supervised_of(ctx, stage_id::rm), rm_steps);
}

} // namespace detail

expected<rl_job> spawn_rl_job(caf::actor_system& sys, const job_config& cfg,
                              const run_options& opts) {
  using namespace detail;
  auto plan = make_plan(cfg);
  if (!plan)
    return plan.error();
  if (plan->uses_workers() && !opts.host)
    return make_error(errc::invalid_argument,
                      "placement.mode " + std::string{to_string(cfg.placement.mode)} +
                        " needs worker processes: run the job with `troupe run` (it launches them)");
  auto dir = check_run_dir(cfg, opts);
  if (!dir)
    return dir.error();
  auto sink = job::metrics_sink::open((*dir / "metrics.jsonl").string(), cfg.stages);
  if (!sink)
    return sink.error();
  auto id = next_job_id();
  auto result = std::make_shared<rl_job::outcome>();
  auto book = std::make_shared<settings_book>(cfg);
  job::job_options o;
  o.id = id;
  o.name = cfg.run.name;
  o.journal_path = (*dir / "events.jsonl").string();
  o.append_journal = opts.resume;
  o.sinks.push_back([s = *sink](const job::event& e) { return (*s)(e); });
  if (opts.tensorboard)
    o.sinks.push_back([tb = job::tensorboard_sink::open((*dir / "tensorboard").string())](
                          const job::event& e) { return (*tb)(e); });
  o.check_update = [book](const std::string& k, const std::string& v) { return book->accept(k, v); };
  o.driver = [cfg, opts, result, plan = std::move(*plan), dir = *dir,
              id](caf::blocking_actor* self, job::driver_link& link) -> job::driver_outcome {
    job_context ctx;
    ctx.sys = &self->system();
    ctx.live = cfg;
    ctx.opts = &opts;
    ctx.self = self;
    ctx.link = &link;
    ctx.plan = plan;
    ctx.run_dir = dir;
    ctx.job_yaml = runtime::to_yaml(cfg, false);
    ctx.channel_prefix = std::string{channel_root} + id + "-";
    in_process_host local_host{opts.factories};
    ctx.host = opts.host ? opts.host : &local_host;
    auto s = drive_job(ctx);
    if (!s) {
      if (ctx.log)
        ctx.log->log(runtime::log_level::error, describe(s.error()));
      result->error = s.error();
      return {job::job_state::failed, describe(s.error())};
    }
    result->summary = std::move(*s);
    return {result->summary.stopped ? job::job_state::cancelled : job::job_state::succeeded, ""};
  };
  return rl_job{job::spawn_job(sys, std::move(o)), result};
}

expected<job_summary> run_job(caf::actor_system& sys, const job_config& cfg, const run_options& opts) {
  auto job = spawn_rl_job(sys, cfg, opts);
  if (!job)
    return job.error();
  if (opts.on_spawn)
    opts.on_spawn(job->actor);
  caf::scoped_actor self{sys};
  expected<job::job_status> status = make_error(errc::internal, "no reply");
  // Both waits are bounded without a deadline of their own: `start` is
  // answered by the handler at once, and `await` when the job reaches a final
  // state — which the driver's requests (each under run.timeouts) and the
  // stop signals' bound (NOTE [stop signals] in apps/console.hpp) make come;
  // a job actor that ends without one answers its awaiters as it ends (NOTE
  // [job actor failures]), and a dead one fails the request at once.
  auto ask_job = [&](auto atom) {
    self->request(job->actor, caf::infinite, atom)
      .receive([&](job::job_status& st) { status = std::move(st); },
               [&](caf::error& e) { status = std::move(e); });
  };
  ask_job(job::start_atom::value);
  if (status)
    ask_job(job::await_atom::value);
  self->send_exit(job->actor, caf::exit_reason::user_shutdown);
  if (!status)
    return status.error();
  if (status->state == job::job_state::failed)
    return job->result->error ? job->result->error : make_error(errc::internal, status->error);
  return job->result->summary;
}

} // namespace troupe::actors::rl
