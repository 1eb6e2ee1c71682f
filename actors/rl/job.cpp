#include "actors/rl/job_internal.hpp"

#include "actors/rl/reward.hpp"
#include "actors/train/engine_group.hpp"
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

// ---- metrics log ------------------------------------------------------------

expected<void> metrics_log::open(const std::string& path) {
  path_ = path;
  f_ = std::fopen(path.c_str(), "a");
  if (!f_)
    return make_error(errc::io_error, "cannot open " + path + ": " + std::strerror(errno));
  return {};
}

metrics_log::~metrics_log() {
  if (f_)
    std::fclose(f_);
}

expected<void> metrics_log::truncate(const std::vector<std::string>& stage_order,
                                     const std::string& stage, int64_t keep_until) {
  auto text = runtime::read_file(path_);
  if (!text)
    return text.error();
  auto pos = std::find(stage_order.begin(), stage_order.end(), stage);
  std::string kept;
  size_t start = 0;
  bool dropped = false;
  while (start < text->size()) {
    auto end = text->find('\n', start);
    if (end == std::string::npos)
      end = text->size(); // a torn last line (killed mid-write) is dropped
    auto line = text->substr(start, end - start);
    bool complete = end < text->size();
    start = end + 1;
    auto j = nlohmann::json::parse(line, nullptr, false);
    bool keep = complete && j.is_object() && j.contains("stage") && j.contains("step");
    if (keep) {
      auto s = j["stage"].get<std::string>();
      auto it = std::find(stage_order.begin(), stage_order.end(), s);
      if (it > pos || (s == stage && j["step"].get<int64_t>() > keep_until))
        keep = false;
    }
    if (keep)
      kept += line + "\n";
    else
      dropped = true;
  }
  if (!dropped)
    return {};
  if (f_) {
    std::fclose(f_);
    f_ = nullptr;
  }
  if (auto ok = runtime::write_file_atomic(path_, kept); !ok)
    return ok;
  return open(path_);
}

expected<void> metrics_log::write(const std::string& stage, int64_t step,
                                  const train::metric_map& m) {
  nlohmann::json j = nlohmann::json::object();
  j["stage"] = stage;
  j["step"] = step;
  for (const auto& [k, v] : m)
    j[k] = std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
  auto line = j.dump() + "\n";
  if (std::fwrite(line.data(), 1, line.size(), f_) != line.size() || std::fflush(f_) != 0)
    return make_error(errc::io_error, "cannot write " + path_ + ": " + std::strerror(errno));
  return {};
}

// ---- context ----------------------------------------------------------------

expected<void> job_context::emit(const std::string& stage, int64_t step, int64_t total,
                                 const train::metric_map& m, double elapsed_s) {
  if (auto ok = log.write(stage, step, m); !ok)
    return ok;
  if (opts->on_progress)
    opts->on_progress(progress_event{stage, step, total, m, elapsed_s});
  return {};
}

std::string job_context::model_dir(const std::string& stage) const {
  if (stage == "base")
    return base_dir;
  return (run_dir / stage / "model").string();
}

expected<models::llama_model> load_model(const std::string& dir, models::head_kind head,
                                         bool allow_missing_head, uint64_t seed) {
  static std::mutex rng;
  std::lock_guard lock{rng};
  torch::manual_seed(seed);
  return models::load_pretrained(dir, head, allow_missing_head);
}

caf::error request_error(const caf::error& err, const std::string& what, caf::timespan timeout) {
  if (err == caf::sec::request_timeout)
    return make_error(errc::timeout,
                      what + ": no reply within " +
                          std::to_string(std::chrono::duration<double>(timeout).count()) +
                          " s (run.request_timeout_s)");
  if (err == caf::sec::request_receiver_down)
    return make_error(errc::unavailable, what + ": the role's actor is down");
  if (err.category() == error_category())
    return with_prefix(err, what);
  return make_error(errc::internal, what + ": " + caf::to_string(err));
}

inference::engine_config engine_settings(const job_config& cfg) {
  auto e = cfg.rl.rollout;
  e.seed = static_cast<uint64_t>(cfg.run.seed);
  return e;
}

namespace {

// Shared-memory channels of this job are named after its process; those of
// processes that died without cleaning up (SIGKILL) are removed at start.
constexpr const char* channel_prefix = "troupe-job-";

// The default folder of disk-transport versions (removed around each stage).
void remove_default_weight_dir(const job_context& ctx, const std::string& stage) {
  if (ctx.cfg->weight_sync.transport != "disk" || !ctx.cfg->weight_sync.dir.empty())
    return;
  std::error_code ec;
  fs::remove_all(ctx.run_dir / stage / "weights", ec);
}

} // namespace

expected<std::vector<caf::actor>> spawn_cast(job_context& ctx, const std::string& stage,
                                             const std::string& role, const std::string& model_dir) {
  role_spec spec;
  spec.stage = stage;
  spec.role = role;
  spec.job_yaml = ctx.job_yaml;
  spec.model_dir = model_dir;
  spec.dp_size = static_cast<int32_t>(ctx.plan.dp_of(stage, role));
  spec.timeout_ms = std::chrono::duration_cast<std::chrono::milliseconds>(ctx.timeout).count();
  auto ranks = ctx.host->spawn(*ctx.sys, spec);
  if (!ranks)
    return with_prefix(ranks.error(), stage + ": spawning " + role);
  return ranks;
}

expected<train::engine_actor> spawn_trainer(job_context& ctx, const std::string& stage,
                                            const std::string& role, const std::string& model_dir) {
  auto ranks = spawn_cast(ctx, stage, role, model_dir);
  if (!ranks)
    return ranks.error();
  if (ranks->size() == 1)
    return caf::actor_cast<train::engine_actor>(ranks->front());
  std::vector<train::engine_actor> typed;
  for (auto& a : *ranks)
    typed.push_back(caf::actor_cast<train::engine_actor>(a));
  return train::spawn_engine_group(*ctx.sys, role, std::move(typed));
}

expected<inference::rollout_actor> spawn_rollout_role(job_context& ctx, const std::string& stage,
                                                      const std::string& model_dir) {
  auto ranks = spawn_cast(ctx, stage, "rollout", model_dir);
  if (!ranks)
    return ranks.error();
  return caf::actor_cast<inference::rollout_actor>(ranks->front());
}

expected<reward_actor> spawn_reward_role(job_context& ctx, const std::string& model_dir) {
  auto ranks = spawn_cast(ctx, "rl", "reward", model_dir);
  if (!ranks)
    return ranks.error();
  return caf::actor_cast<reward_actor>(ranks->front());
}

expected<inference::weight_channel> weight_channel_for(job_context& ctx, const std::string& stage) {
  const auto& w = ctx.cfg->weight_sync;
  inference::weight_channel c;
  // auto: by reference in one process, through shared memory between two.
  c.kind = w.transport != "auto" ? w.transport
           : ctx.host->process_of("policy") == ctx.host->process_of("rollout") ? "alias"
                                                                              : "shm";
  c.channel = channel_prefix + std::to_string(::getpid()) + "-" + stage;
  c.dir = w.dir.empty() ? (ctx.run_dir / stage / "weights").string() : w.dir;
  c.keep = w.keep;
  c.timeout_ms = std::chrono::duration_cast<std::chrono::milliseconds>(ctx.timeout).count();
  if (c.kind == "broadcast") {
    if (!ctx.weight_store) {
      runtime::store_options so;
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
  }
  return c;
}

expected<void> sync_weights(caf::blocking_actor* self, job_context& ctx, const std::string& stage,
                            const train::engine_actor& trainer,
                            const inference::rollout_actor& rollout, int64_t version) {
  auto ch = weight_channel_for(ctx, stage);
  if (!ch)
    return ch.error();
  const auto& channel = *ch;
  expected<int64_t> sent = make_error(errc::internal, "no reply"), got = sent;
  if (channel.kind == "broadcast") {
    // A collective: both ends must be in it at once.
    auto p = self->request(trainer, ctx.timeout, train::publish_atom::value, version, channel);
    auto r = self->request(rollout, ctx.timeout, inference::receive_weights_atom::value, version, channel);
    p.receive([&](int64_t b) { sent = b; },
              [&](caf::error& e) { sent = request_error(e, "policy: publish weights", ctx.timeout); });
    r.receive([&](int64_t b) { got = b; },
              [&](caf::error& e) { got = request_error(e, "rollout: receive weights", ctx.timeout); });
  } else {
    sent = ask<int64_t>(self, trainer, ctx.timeout, "policy: publish weights",
                        train::publish_atom::value, version, channel);
    if (sent)
      got = ask<int64_t>(self, rollout, ctx.timeout, "rollout: receive weights",
                         inference::receive_weights_atom::value, version, channel);
  }
  if (!sent)
    return sent.error();
  if (!got)
    return got.error();
  if (*got != *sent)
    return make_error(errc::corrupted, "weight sync " + std::to_string(version) + ": " +
                                           std::to_string(*sent) + " bytes published, " +
                                           std::to_string(*got) + " received");
  return {};
}

namespace {

// One evaluation pass over the held-out prompts: `samples` responses per
// prompt at `temperature` (0 = greedy), seeds fixed per prompt so every
// evaluation of the same weights gives the same number.
expected<void> evaluate_pass(caf::blocking_actor* self, job_context& ctx,
                             const inference::rollout_actor& rollout, double temperature,
                             int64_t samples, const std::string& prefix, train::metric_map& m) {
  const auto& eval = ctx.data.eval;
  std::vector<inference::generate_request> reqs;
  reqs.reserve(eval.size());
  for (size_t i = 0; i < eval.size(); ++i) {
    inference::generate_request r;
    r.id = "eval-" + std::to_string(i);
    r.prompt = encode_prompt(*ctx.tok, eval[i].prompt);
    r.sampling.temperature = temperature;
    r.sampling.n = static_cast<int32_t>(samples);
    r.sampling.max_tokens = ctx.cfg->rl.generation.max_tokens;
    r.sampling.seed = mix_seed({static_cast<uint64_t>(ctx.cfg->run.seed), 71, i});
    reqs.push_back(std::move(r));
  }
  auto outs = ask<std::vector<inference::request_output>>(self, rollout, ctx.timeout,
                                                          "rollout: evaluation",
                                                          inference::generate_atom::value, reqs);
  if (!outs)
    return outs.error();
  std::vector<std::vector<int64_t>> responses;
  std::vector<std::string> answers;
  double length = 0;
  for (size_t i = 0; i < outs->size(); ++i)
    for (auto& s : (*outs)[i].samples) {
      length += static_cast<double>(s.tokens.size());
      responses.push_back(std::move(s.tokens));
      answers.push_back(eval[i].answer);
    }
  auto rule = parse_rule_kind(ctx.cfg->rl.reward.rule);
  if (!rule)
    return rule.error();
  auto scores = rule_scores(*ctx.tok, *rule, responses, answers);
  if (!scores)
    return scores.error();
  auto exact = rule_scores(*ctx.tok, rule_kind::exact, responses, answers);
  if (!exact)
    return exact.error();
  double sum = 0, hits = 0;
  for (size_t i = 0; i < scores->size(); ++i) {
    sum += (*scores)[i];
    hits += (*exact)[i];
  }
  auto n = static_cast<double>(std::max<size_t>(1, scores->size()));
  m[prefix + "score/mean"] = sum / n;
  m[prefix + "accuracy"] = hits / n;
  m[prefix + "response_length/mean"] = length / n;
  return {};
}

} // namespace

expected<void> evaluate(caf::blocking_actor* self, job_context& ctx,
                        const inference::rollout_actor& rollout, train::metric_map& m) {
  const auto& r = ctx.cfg->rl;
  if (r.eval_temperature > 0) {
    if (auto ok = evaluate_pass(self, ctx, rollout, r.eval_temperature, r.eval_samples, "val/", m);
        !ok)
      return ok;
    if (auto ok = evaluate_pass(self, ctx, rollout, 0, 1, "val/greedy/", m); !ok)
      return ok;
  } else {
    if (auto ok = evaluate_pass(self, ctx, rollout, 0, 1, "val/", m); !ok)
      return ok;
  }
  // Evaluation prompts must not leave cached prefixes behind: the next
  // training batch then computes the same whether or not an evaluation ran
  // before it (a resumed run has not run it).
  auto cleared = ask<int64_t>(self, rollout, ctx.timeout, "rollout: clear cache",
                              inference::clear_cache_atom::value);
  if (!cleared)
    return cleared.error();
  return {};
}

namespace {

// ---- checkpoints of the SFT / RM stages --------------------------------------

expected<void> save_stage_checkpoint(caf::blocking_actor* self, job_context& ctx,
                                     const std::string& stage, const train::engine_actor& trainer,
                                     int64_t step) {
  auto state = ask<std::string>(self, trainer, ctx.timeout, stage + ": save state",
                                train::save_state_atom::value);
  if (!state)
    return state.error();
  runtime::checkpoint_files files;
  files["model.state"] = std::move(*state);
  files["driver.json"] = nlohmann::json{{"stage", stage}, {"step", step}}.dump() + "\n";
  char name[32];
  std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(step));
  return runtime::write_checkpoint((ctx.run_dir / stage / "checkpoints").string(), name, files);
}

/// Restores the latest checkpoint of `stage` into `engine`; returns its step (0 without one).
// Where a supervised stage resumes: its step, and the training state to
// load (none for a fresh start).
struct stage_start {
  int64_t step = 0;
  std::optional<std::string> state;
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
  if (!files->count("model.state") || !files->count("driver.json"))
    return make_error(errc::corrupted, *dir + ": not a " + stage + " checkpoint");
  auto j = nlohmann::json::parse(files->at("driver.json"), nullptr, false);
  if (j.is_discarded() || !j.contains("step"))
    return make_error(errc::corrupted, *dir + ": driver.json is malformed");
  return stage_start{j["step"].get<int64_t>(), files->at("model.state"), *dir};
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
  s.steps = j.value("steps", int64_t{0});
  s.output = j.value("output", std::string{});
  if (j.contains("metrics"))
    for (const auto& [k, v] : j["metrics"].items())
      s.metrics[k] = v.get<double>();
  return s;
}

// ---- SFT and RM drivers -------------------------------------------------------

struct supervised_stage {
  std::string name;       // "sft" | "rm"
  int64_t steps = 0;
  int64_t batch_size = 0;
  int64_t eval_every = 0;
  std::string init_dir;
  models::head_kind head = models::head_kind::lm;
  train::optimizer_options optim;
};

// Preference pairs as chosen / rejected sequences (prompt + response + EOS).
expected<runtime::tensor_batch> pair_batch(job_context& ctx, const std::vector<preference_pair>& rows) {
  std::vector<std::vector<int64_t>> chosen, rejected;
  for (const auto& p : rows) {
    auto prompt = encode_prompt(*ctx.tok, p.prompt);
    auto c = encode_response(*ctx.tok, p.chosen);
    auto r = encode_response(*ctx.tok, p.rejected);
    chosen.push_back(prompt);
    chosen.back().insert(chosen.back().end(), c.begin(), c.end());
    rejected.push_back(prompt);
    rejected.back().insert(rejected.back().end(), r.begin(), r.end());
  }
  return collate_pairs(chosen, rejected, ctx.pad);
}

// One step's batch: demonstrations (sft) or preference pairs (rm).
expected<runtime::tensor_batch> supervised_batch(job_context& ctx, const supervised_stage& st,
                                                 int64_t step) {
  auto seed = mix_seed({static_cast<uint64_t>(ctx.cfg->run.seed), st.name == "sft" ? 11u : 12u});
  if (st.name == "sft") {
    const auto& rows = ctx.data.sft;
    auto idx = batch_indices(static_cast<int64_t>(rows.size()), seed, step * st.batch_size, st.batch_size);
    std::vector<std::vector<int64_t>> prompts, responses;
    for (auto i : idx) {
      prompts.push_back(encode_prompt(*ctx.tok, rows[static_cast<size_t>(i)].prompt));
      responses.push_back(encode_response(*ctx.tok, rows[static_cast<size_t>(i)].response));
    }
    return collate_sequences(prompts, responses, ctx.pad);
  }
  const auto& rows = ctx.data.preferences;
  auto idx = batch_indices(static_cast<int64_t>(rows.size()), seed, step * st.batch_size, st.batch_size);
  std::vector<preference_pair> picked;
  picked.reserve(idx.size());
  for (auto i : idx)
    picked.push_back(rows[static_cast<size_t>(i)]);
  return pair_batch(ctx, picked);
}

expected<runtime::tensor_batch> rm_eval_batch(job_context& ctx) {
  return pair_batch(ctx, ctx.data.eval_preferences);
}

expected<stage_summary> run_supervised(job_context& ctx, const supervised_stage& st) {
  stopwatch clock;
  auto start = restore_stage(ctx, st.name);
  if (!start)
    return start.error();
  if (auto ok = ctx.log.truncate(ctx.cfg->stages, st.name, start->step); !ok)
    return ok.error();
  bool is_sft = st.name == "sft";
  auto trainer_or = spawn_trainer(ctx, st.name, is_sft ? "policy" : "reward", st.init_dir);
  if (!trainer_or)
    return trainer_or.error();
  auto trainer = *trainer_or;
  std::optional<inference::rollout_actor> rollout;
  if (is_sft) {
    auto r = spawn_rollout_role(ctx, st.name, st.init_dir);
    if (!r) {
      caf::anon_send_exit(trainer, caf::exit_reason::user_shutdown);
      return r.error();
    }
    rollout = *r;
  }
  std::optional<runtime::tensor_batch> eval_pairs;
  if (!is_sft) {
    auto b = rm_eval_batch(ctx);
    if (!b)
      return b.error();
    eval_pairs = std::move(*b);
  }
  auto body = [&](caf::blocking_actor* self) -> expected<stage_summary> {
    stage_summary sum;
    sum.stage = st.name;
    sum.output = ctx.model_dir(st.name);
    auto finish = [&](expected<stage_summary> r) {
      self->send_exit(trainer, caf::exit_reason::user_shutdown);
      if (rollout)
        self->send_exit(*rollout, caf::exit_reason::user_shutdown);
      return r;
    };
    if (start->state) {
      auto loaded = ask<int64_t>(self, trainer, ctx.timeout, start->dir + ": load state",
                                 train::load_state_atom::value, *start->state);
      if (!loaded)
        return finish(loaded.error());
    }
    for (int64_t step = start->step; step < st.steps; ++step) {
      if (ctx.stop_requested()) {
        if (auto ok = save_stage_checkpoint(self, ctx, st.name, trainer, step); !ok)
          return finish(ok.error());
        sum.steps = step;
        sum.stopped = true;
        return finish(sum);
      }
      auto batch = supervised_batch(ctx, st, step);
      if (!batch)
        return finish(batch.error());
      auto m = is_sft ? ask<train::metric_map>(self, trainer, ctx.timeout, "policy: sft step",
                                               train::sft_step_atom::value, *batch)
                      : ask<train::metric_map>(self, trainer, ctx.timeout, "reward: rm step",
                                               train::rm_step_atom::value, *batch);
      if (!m)
        return finish(m.error());
      bool last = step + 1 == st.steps;
      if (last || (st.eval_every > 0 && (step + 1) % st.eval_every == 0)) {
        if (is_sft) {
          if (auto ok = sync_weights(self, ctx, st.name, trainer, *rollout, step + 1); !ok)
            return finish(ok.error());
          if (auto ok = evaluate(self, ctx, *rollout, *m); !ok)
            return finish(ok.error());
        } else {
          auto e = ask<train::metric_map>(self, trainer, ctx.timeout, "reward: rm eval",
                                          train::rm_eval_atom::value, *eval_pairs);
          if (!e)
            return finish(e.error());
          m->insert(e->begin(), e->end());
        }
        if (!last)
          if (auto ok = save_stage_checkpoint(self, ctx, st.name, trainer, step + 1); !ok)
            return finish(ok.error());
      }
      (*m)["training/global_step"] = static_cast<double>(step + 1);
      if (auto ok = ctx.emit(st.name, step + 1, st.steps, *m, clock.seconds()); !ok)
        return finish(ok.error());
      sum.metrics = *m;
      sum.steps = step + 1;
    }
    auto saved = ask<std::string>(self, trainer, ctx.timeout, st.name + ": save model",
                                  train::save_model_atom::value, sum.output);
    if (!saved)
      return finish(saved.error());
    return finish(sum);
  };
  auto r = run_driver<stage_summary>(*ctx.sys, body);
  if (r)
    r->seconds = clock.seconds();
  return r;
}

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
  torch::manual_seed(mix_seed({static_cast<uint64_t>(ctx.cfg->run.seed), 31}));
  auto model = models::make_llama(c, models::head_kind::lm);
  if (!model)
    return with_prefix(model.error(), "model");
  return models::save_pretrained(*model, ctx.base_dir);
}

} // namespace
} // namespace detail

expected<job_summary> run_job(caf::actor_system& sys, const job_config& cfg, const run_options& opts) {
  using namespace detail;
  namespace fs = std::filesystem;
  job_context ctx;
  ctx.sys = &sys;
  ctx.cfg = &cfg;
  ctx.opts = &opts;
  ctx.timeout = std::chrono::duration_cast<caf::timespan>(
      std::chrono::duration<double>(cfg.run.request_timeout_s));
  auto plan = make_plan(cfg);
  if (!plan)
    return plan.error();
  ctx.plan = std::move(*plan);
  ctx.job_yaml = runtime::to_yaml(cfg, false);
  in_process_host local_host;
  ctx.host = opts.host ? opts.host : &local_host;
  if (ctx.plan.uses_workers() && !opts.host)
    return make_error(errc::invalid_argument,
                      "placement.mode " + cfg.placement.mode +
                          " needs worker processes: run the job with `troupe run` (it launches them)");

  std::error_code ec;
  ctx.run_dir = fs::absolute(cfg.run.dir, ec);
  auto metrics_path = ctx.run_dir / "metrics.jsonl";
  if (!opts.resume && fs::exists(metrics_path, ec) && fs::file_size(metrics_path, ec) > 0)
    return make_error(errc::invalid_argument,
                      "run.dir " + ctx.run_dir.string() +
                          " already holds a run: pass --resume to continue it, or choose another "
                          "run.dir");
  fs::create_directories(ctx.run_dir, ec);
  if (ec)
    return make_error(errc::io_error, "cannot create " + ctx.run_dir.string() + ": " + ec.message());
  runtime::set_compute_threads(static_cast<int>(cfg.run.threads));
  auto data = load_job_data(cfg.data);
  if (!data)
    return data.error();
  ctx.data = std::move(*data);
  if (auto ok = ctx.log.open(metrics_path.string()); !ok)
    return ok.error();
  if (auto ok = prepare_base(ctx); !ok)
    return ok.error();
  if (auto ok = runtime::write_file_atomic((ctx.run_dir / "config.yaml").string(), ctx.job_yaml);
      !ok)
    return ok.error();

  runtime::remove_orphaned_shm_segments(channel_prefix);
  job_summary summary;
  summary.run_dir = ctx.run_dir.string();
  for (const auto& stage : cfg.stages) {
    if (opts.resume && fs::exists(ctx.run_dir / stage / "done", ec)) {
      auto s = read_done(ctx, stage);
      if (!s)
        return s.error();
      summary.stages.push_back(std::move(*s));
      continue;
    }
    remove_default_weight_dir(ctx, stage);
    expected<stage_summary> s = make_error(errc::internal, "unknown stage " + stage);
    if (stage == "sft" || stage == "rm") {
      supervised_stage st;
      st.name = stage;
      if (stage == "sft") {
        st.steps = cfg.sft.steps;
        st.batch_size = cfg.sft.batch_size;
        st.eval_every = cfg.sft.eval_every;
        st.optim = cfg.sft.optim;
        st.init_dir = ctx.base_dir;
      } else {
        st.steps = cfg.rm.steps;
        st.batch_size = cfg.rm.batch_size;
        st.eval_every = cfg.rm.eval_every;
        st.optim = cfg.rm.optim;
        st.head = models::head_kind::reward;
        st.init_dir = ctx.model_dir(cfg.rm.init == "sft" ? "sft" : "base");
      }
      s = run_supervised(ctx, st);
    } else if (stage == "rl") {
      s = run_rl_stage(ctx);
    }
    remove_default_weight_dir(ctx, stage);
    if (!s)
      return s.error();
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

} // namespace troupe::actors::rl
