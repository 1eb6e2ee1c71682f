// The phases of an RL iteration (NOTE [rl iteration] in rl_stage.cpp): each
// reads and fills the iteration_state; the math is in kernels/.

#include "actors/rl/rl_driver.hpp"

#include "actors/rl/agent_runs.hpp"
#include "actors/rl/episodes.hpp"
#include "kernels/losses.hpp"
#include "kernels/masked.hpp"
#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <optional>

namespace troupe::actors::rl::detail {

namespace {

double masked_mean_of(const at::Tensor& x, const at::Tensor& mask) {
  return value_or_throw(kernels::masked_mean(x.to(torch::kFloat), mask)).item<double>();
}

at::Tensor log_probs_of(const expected<runtime::tensor_batch>& b) {
  return value_or_throw(value_or_throw(b).get("log_probs"));
}

// The dense scores in the batch's [B, L-1] layout, once it is collated.
void place_token_scores(iteration_state& s) {
  if (!s.token_score_rows.empty() && s.mask.defined())
    s.token_scores = scatter_response_values(s.prompts, s.token_score_rows, s.mask.size(1) + 1);
}

} // namespace

// The training rows of iteration `it` (the data position is it × prompts).
std::vector<example> rl_driver::rows_of(int64_t it) const {
  const auto& r = ctx_.cfg->rl;
  auto seed = static_cast<uint64_t>(ctx_.cfg->run.seed);
  auto idx = batch_indices(ctx_.data.train.size(), mix_seed({seed, 51}),
                           it * r.prompts_per_iteration, r.prompts_per_iteration);
  return value_or_throw(ctx_.data.train.rows(idx));
}

namespace {

// The requests for `rows`: n samples each, request i seeded by seed_of(i)
// and named `prefix` + i (unique among the batches in flight at once).
std::vector<inference::generate_request>
requests_for(job_context& ctx, const std::vector<example>& rows, const std::string& prefix,
             const std::function<uint64_t(size_t)>& seed_of) {
  const auto& r = ctx.cfg->rl;
  std::vector<inference::generate_request> reqs;
  reqs.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    inference::generate_request q;
    q.id = prefix + std::to_string(i);
    q.prompt = value_or_throw(ctx.enc.prompt(rows[i].prompt, rows[i].messages));
    q.sampling.temperature = r.generation.temperature;
    q.sampling.top_k = r.generation.top_k;
    q.sampling.top_p = r.generation.top_p;
    q.sampling.n = static_cast<int32_t>(r.samples_per_prompt);
    q.sampling.max_tokens = r.generation.max_tokens;
    q.sampling.seed = seed_of(i);
    reqs.push_back(std::move(q));
  }
  return reqs;
}

} // namespace

// The requests of iteration `it` (seeds from the run seed, it, prompt).
std::vector<inference::generate_request> rl_driver::gen_requests(int64_t it) const {
  auto seed = static_cast<uint64_t>(ctx_.cfg->run.seed);
  return requests_for(ctx_, rows_of(it), std::to_string(it) + "/", [&](size_t i) {
    return mix_seed({seed, 52, static_cast<uint64_t>(it), i});
  });
}

// NOTE [dynamic sampling]: refill round k of iteration it draws its prompts
// from a stream of its own, a pure function of (run seed, it, k), so the
// data position stays it × prompts and a resumed run refills the same way.
std::vector<inference::generate_request> rl_driver::refill_requests(int64_t it, int64_t round,
                                                                    std::vector<example>& rows) const {
  const auto& r = ctx_.cfg->rl;
  auto seed = static_cast<uint64_t>(ctx_.cfg->run.seed);
  auto idx = batch_indices(ctx_.data.train.size(), mix_seed({seed, 55, static_cast<uint64_t>(it)}),
                           round * r.prompts_per_iteration, r.prompts_per_iteration);
  rows = value_or_throw(ctx_.data.train.rows(idx));
  return requests_for(
      ctx_, rows, std::to_string(it) + "/refill" + std::to_string(round) + "/", [&](size_t i) {
        return mix_seed({seed, 56, static_cast<uint64_t>(it), static_cast<uint64_t>(round), i});
      });
}

void rl_driver::take_samples(iteration_state& s, inference::request_output& out,
                             const example& row) const {
  for (auto& smp : out.samples) {
    s.prompts.push_back(out.prompt);
    s.responses.push_back(std::move(smp.tokens));
    s.engine_lp.push_back(std::move(smp.logprobs));
    s.token_version_rows.push_back(std::move(smp.versions));
    s.answers.push_back(row.answer);
    s.metadata.push_back(row.metadata);
  }
}

// NOTE [overlapped scoring]: with rl.reward.overlap (auto: a remote reward),
// gen sends the batch's prompts to the rollout in parts (calls that join one
// running batch: NOTE [rollout actor loop]) and, as each part's samples
// arrive, asks the reward role to score them, so scoring runs while the rest
// generates. The gen phase ends when the last part has generated; the
// scoring then also runs behind old_log_prob, ref and values, and the reward
// phase waits for the scores still outstanding: timing_s/reward and its
// phase events cover only the part of scoring nothing hid, and
// timing_s/reward_hidden is the reward role's busy time beyond it (its
// serving seconds, minus the wait). Parts are answered in order of their
// requests, so an iteration's batch composition is the same as without
// overlap; the engine's batch across the parts may differ in step timing.
// The reward role scores one part at a time, so a part is never smaller
// than what a remote reward scores at once (batch_size × max_in_flight
// samples): smaller parts would trade its concurrency for overlap and lose
// (bench: 8 parts of 16 samples to a 50 ms service took 0.19 s after
// generation against 0.05 s without overlap).
namespace {

constexpr size_t overlap_parts = 8;

// Prompts per part of gen_scored.
size_t prompts_per_part(const rl_config& r, size_t prompts) {
  size_t per = (prompts + overlap_parts - 1) / overlap_parts;
  if (r.reward.kind == reward_kind::remote) {
    auto at_once = static_cast<size_t>(r.reward.remote.batch_size * r.reward.remote.max_in_flight);
    auto n = static_cast<size_t>(std::max<int64_t>(1, r.samples_per_prompt));
    per = std::max(per, (at_once + n - 1) / n);
  }
  return std::max<size_t>(1, per);
}

} // namespace

expected<void> rl_driver::gen_scored(iteration_state& s) {
  auto* self = ctx_.self;
  auto rows = rows_of(s.it);
  auto reqs = gen_requests(s.it);
  auto per_part = prompts_per_part(ctx_.cfg->rl, reqs.size());
  using handle = decltype(self->request(rollout(), ctx_.timeout_of(request_kind::generate),
                                        inference::generate_atom::value, reqs));
  std::vector<std::pair<size_t, handle>> parts;
  for (size_t b = 0; b < reqs.size(); b += per_part) {
    std::vector<inference::generate_request> part(
        reqs.begin() + static_cast<long>(b),
        reqs.begin() + static_cast<long>(std::min(reqs.size(), b + per_part)));
    parts.emplace_back(b, self->request(rollout(), ctx_.timeout_of(request_kind::generate),
                                        inference::generate_atom::value, std::move(part)));
  }
  auto scorer = cast_.handle_as<reward_actor>(role_id::reward);
  const auto timeout = ctx_.timeout_of(request_kind::compute);
  for (auto& [first, h] : parts) {
    expected<std::vector<inference::request_output>> outs = make_error(errc::internal, "no reply");
    h.receive([&](inference::generation& g) { outs = take_generation(ctx_, std::move(g)); },
              [&](caf::error& e) {
                outs = request_error(e, "rollout: gen", ctx_.timeout_of(request_kind::generate));
              });
    if (!outs)
      return outs.error();
    auto begin = s.responses.size();
    for (size_t i = 0; i < outs->size(); ++i)
      take_samples(s, (*outs)[i], rows[first + i]);
    auto rh = std::make_shared<decltype(self->request(scorer, timeout, reward_atom::value,
                                                      reward_request{}))>(
        self->request(scorer, timeout, reward_atom::value,
                      reward_request_of(s, begin, s.responses.size())));
    s.pending_scores.push_back([rh, timeout]() -> expected<train::served_batch> {
      expected<train::served_batch> out = make_error(errc::internal, "no reply");
      rh->receive([&](train::served_batch& b) { out = std::move(b); },
                  [&](caf::error& e) { out = request_error(e, "reward: score", timeout); });
      return out;
    });
  }
  return {};
}

// NOTE [episodes]: the iteration's prompts (the batch path's requests:
// ids, sampling, seeds) as episodes with the job's environment.
expected<void> rl_driver::gen_episodes(iteration_state& s) {
  const auto& r = ctx_.cfg->rl;
  auto rows = rows_of(s.it);
  auto reqs = gen_requests(s.it);
  std::vector<episode_prompt> prompts;
  for (size_t i = 0; i < reqs.size(); ++i)
    prompts.push_back({reqs[i].id, rows[i], reqs[i].sampling});
  auto o = episode_options_of(ctx_, s.it + 1);
  auto got = ctx_.agents ? agent_episodes(s, prompts, o)
                         : run_episodes(*ctx_.sys, rollout(), ctx_.env, ctx_.enc, prompts, o);
  if (!got)
    return got.error();
  inference::generation seen{{}, got->stats.engine};
  (void)take_generation(ctx_, std::move(seen));
  for (auto& [k, v] : episode_metrics(*got))
    s.m[k] = v;
  const auto n = static_cast<size_t>(r.samples_per_prompt);
  bool shaped = false;
  for (size_t i = 0; i < got->episodes.size(); ++i) {
    auto& ep = got->episodes[i];
    const auto& row = rows[i / n];
    s.prompts.push_back(std::move(ep.prompt));
    s.responses.push_back(std::move(ep.tokens));
    s.engine_lp.push_back(std::move(ep.logprobs));
    s.token_version_rows.push_back(std::move(ep.versions));
    s.loss_mask_rows.push_back(std::move(ep.loss_mask));
    s.answers.push_back(row.answer);
    s.metadata.push_back(row.metadata);
    s.env_rewards.push_back(ep.reward);
    s.last_turn_begin.push_back(ep.last_turn_begin);
    shaped = shaped || !ep.shaping.empty();
    s.shaping_rows.push_back(std::move(ep.shaping));
  }
  if (!shaped)
    s.shaping_rows.clear();
  return {};
}

// NOTE [agent runs]: an endpoint for this iteration, serving the calls
// with the batch path's sampling, and the agent run through it.
expected<episode_batch> rl_driver::agent_episodes(iteration_state& s,
                                                  const std::vector<episode_prompt>& prompts,
                                                  const episode_options& o) {
  const auto& cfg = *ctx_.cfg;
  const auto& a = cfg.rl.agent;
  agent_endpoint_spec spec;
  spec.job = ctx_.cfg;
  if (!prompts.empty())
    spec.defaults = prompts.front().sampling;
  spec.defaults.n = 1;
  spec.defaults.seed.reset();
  spec.max_context = o.max_context;
  spec.generate_timeout_s = o.generate_timeout_s;
  auto host = ctx_.opts->factories.agent_endpoint(*ctx_.sys, caf::actor_cast<caf::actor>(rollout()),
                                                  ctx_.agents, spec);
  if (!host)
    return host.error();
  const auto dir = ctx_.run_dir / "agent";
  std::error_code ec;
  fs::create_directories(dir, ec);
  agent_run_options ro;
  ro.command = a.command;
  ro.timeout_s = a.timeout_s;
  ro.max_calls = a.max_calls > 0 ? a.max_calls : cfg.rl.environment.max_turns;
  ro.task_file = (dir / "tasks.jsonl").string();
  ro.log_file = a.log_file.empty() ? (dir / "agent.log").string() : a.log_file;
  ro.episodes = o;
  ro.need_reward = cfg.rl.environment.score != episode_score::reward;
  auto got = run_agent_episodes(**host, *ctx_.agents, ctx_.env, ctx_.enc, prompts, ro);
  if (!got)
    return got.error();
  for (auto& [k, v] : got->metrics)
    s.m[k] = v;
  return std::move(got->batch);
}

expected<void> rl_driver::gen(iteration_state& s) {
  const auto& r = ctx_.cfg->rl;
  if (auto ahead = ahead_.find(s.it); ahead != ahead_.end()) { // NOTE [staleness]
    if (auto ok = collect_ahead(s.it, s.it); !ok)
      return ok;
    auto outs = ahead->second.outputs; // kept for a checkpoint before the updates
    auto rows = rows_of(s.it);         // for the answers
    for (size_t i = 0; i < outs.size(); ++i)
      take_samples(s, outs[i], rows[i]);
  } else if (episodic()) {
    if (auto ok = gen_episodes(s); !ok)
      return ok;
  } else if (overlaps_scoring(r.reward)) {
    if (auto ok = gen_scored(s); !ok)
      return ok;
  } else {
    auto outs = generate(ctx_, rollout(), gen_requests(s.it), "rollout: gen");
    if (!outs)
      return outs.error();
    auto rows = rows_of(s.it);
    for (size_t i = 0; i < outs->size(); ++i)
      take_samples(s, (*outs)[i], rows[i]);
  }
  if (r.dynamic_sampling.enabled)
    if (auto ok = dynamic_sampling(s); !ok)
      return ok;
  auto b = collate_sequences(s.prompts, s.responses, ctx_.pad);
  if (!b)
    return b.error();
  s.batch = std::move(*b);
  s.mask = value_or_throw(s.batch.get("response_mask"));
  auto length = value_or_throw(s.batch.get("input_ids")).size(1);
  if (!s.loss_mask_rows.empty()) { // NOTE [episodes]: observations carry no loss
    s.mask = s.mask * scatter_response_values(s.prompts, s.loss_mask_rows, length);
    value_or_throw(s.batch.set("response_mask", s.mask));
  }
  place_token_scores(s);
  s.eng_lp = scatter_response_values(s.prompts, s.engine_lp, length);
  std::vector<std::vector<float>> versions;
  for (const auto& row : s.token_version_rows)
    versions.emplace_back(row.begin(), row.end());
  s.token_versions = scatter_response_values(s.prompts, versions, length);
  return submit_ahead(s.it);
}

// NOTE [staleness]: the batches of the next k iterations are requested as
// soon as the one before them is (the same requests and seeds as
// synchronously), with the weights loaded now. Those requested together
// (the first k, or after a resume) go in one call, so the engine admits
// them at once and schedules them the same way in every run.
expected<void> rl_driver::submit_ahead(int64_t it) {
  const auto& r = ctx_.cfg->rl;
  // Resumed from a checkpoint taken after this iteration asked (a boundary
  // after gen): the rollout's snapshot already holds what it asked for,
  // and a paced rollout has run its steps.
  if (it <= progress_.ahead_asked)
    return {};
  std::vector<int64_t> missing;
  for (auto next = it + 1; next <= it + r.staleness && next < r.iterations; ++next)
    if (!ahead_.count(next))
      missing.push_back(next);
  // NOTE [paced rollout]: a paced rollout steps its pace after each call,
  // so one goes out every iteration, empty once no batch is left to ask
  // for: the last batches ahead get their steps too.
  const bool paced = r.inflight_updates && r.inflight_steps > 0;
  if (missing.empty() && !paced) {
    progress_.ahead_asked = it;
    return {};
  }
  std::vector<inference::generate_request> requests;
  std::map<int64_t, std::vector<std::string>> ids;
  for (auto next : missing)
    for (auto& q : gen_requests(next)) {
      ids[next].push_back(q.id);
      requests.push_back(std::move(q));
    }
  // NOTE [batches ahead]: queued now, collected when their iteration comes.
  auto queued = ask<int64_t>(ctx_.self, rollout(), ctx_.timeout_of(request_kind::generate),
                             "rollout: gen (ahead)", inference::generate_atom::value,
                             inference::ahead_atom::value, std::move(requests));
  if (!queued)
    return queued.error(); // asked again if the phase runs again (NOTE [supervision])
  progress_.ahead_asked = it;
  for (auto& [next, batch_ids] : ids)
    ahead_[next].in_rollout = std::move(batch_ids);
  return {};
}

expected<void> rl_driver::collect_ahead(int64_t first, int64_t last) {
  std::vector<std::string> ids;
  std::vector<std::pair<int64_t, ahead_batch*>> batches;
  for (auto& [it, batch] : ahead_) {
    if (it < first || it > last || batch.in_rollout.empty())
      continue;
    ids.insert(ids.end(), batch.in_rollout.begin(), batch.in_rollout.end());
    batches.emplace_back(it, &batch);
  }
  if (ids.empty())
    return {};
  auto got =
      ask<inference::generation>(ctx_.self, rollout(), ctx_.timeout_of(request_kind::generate),
                                 "rollout: gen (collect)", inference::collect_atom::value, ids);
  if (!got)
    return got.error();
  auto outs = take_generation(ctx_, std::move(*got));
  if (outs.size() != ids.size())
    return make_error(errc::internal, "rollout: collect answered " + std::to_string(outs.size()) +
                                          " of " + std::to_string(ids.size()) + " requests");
  size_t at = 0;
  for (auto [it, batch] : batches) {
    auto n = batch->in_rollout.size();
    batch->outputs.assign(std::make_move_iterator(outs.begin() + static_cast<long>(at)),
                          std::make_move_iterator(outs.begin() + static_cast<long>(at + n)));
    at += n;
    batch->in_rollout.clear();
    if (std::exchange(batch->restored, false))
      if (auto ok = check_ahead_batches(ctx_.cfg->rl, it, {{it, batch->outputs}}); !ok)
        return with_prefix(ok.error(), "resumed batches ahead");
  }
  return {};
}

bool rl_driver::ahead_in_flight() const {
  return std::any_of(ahead_.begin(), ahead_.end(),
                     [](const auto& kv) { return !kv.second.in_rollout.empty(); });
}

namespace {

// NOTE [rl iteration]: the trainer–generator contract's metrics: mean and
// max |trainer − rollout| over response tokens, and KL(rollout ‖ trainer)
// by the k1 estimator.
void report_rollout_corr(train::metric_map& m, double mean, double max, double kl) {
  m["rollout_corr/logprob_abs_diff_mean"] = mean;
  m["rollout_corr/logprob_abs_diff_max"] = max;
  m["rollout_corr/kl"] = kl;
  m["rollout/logprob_diff"] = mean; // the earlier names, kept one release
  m["rollout/logprob_diff_max"] = max;
}

} // namespace

expected<void> rl_driver::old_log_prob(iteration_state& s) {
  if (!algo_.policy_old_logprobs) {
    s.old_lp = s.eng_lp;
  } else {
    auto lp = ask_served<runtime::tensor_batch>(
        ctx_, trainer(role_id::policy), request_kind::compute, "policy: old_log_prob", train::log_probs_atom::value, s.batch, ctx_.cfg->rl.generation.temperature, false);
    if (!lp)
      return lp.error();
    s.old_lp = log_probs_of(lp);
    // The trainer–generator contract: how far the rollout's log-probs of
    // its own samples are from the trainer's (and, with staleness, from
    // the newer weights'); KL(rollout ‖ trainer) by the k1 estimator.
    auto diff = (s.old_lp - s.eng_lp).abs();
    report_rollout_corr(s.m, masked_mean_of(diff, s.mask), (diff * s.mask).max().item<double>(),
                        masked_mean_of(s.eng_lp - s.old_lp, s.mask));
  }
  value_or_throw(s.batch.set("old_log_probs", s.old_lp));
  if (!algo_.use_reference)
    s.ref_lp = s.old_lp;
  return {};
}

expected<void> rl_driver::ref(iteration_state& s) {
  auto lp = ask_served<runtime::tensor_batch>(
      ctx_, trainer(role_id::reference), request_kind::compute, "reference: ref", train::log_probs_atom::value, s.batch, ctx_.cfg->rl.generation.temperature, false);
  if (!lp)
    return lp.error();
  s.ref_lp = log_probs_of(lp);
  value_or_throw(s.batch.set("ref_log_probs", s.ref_lp));
  return {};
}

expected<void> rl_driver::values(iteration_state& s) {
  auto v = ask_served<runtime::tensor_batch>(ctx_, trainer(role_id::critic), request_kind::compute, "critic: values",
                                            train::values_atom::value, s.batch);
  if (!v)
    return v.error();
  s.values = value_or_throw(v->get("values"));
  value_or_throw(s.batch.set("values", s.values));
  return {};
}

reward_request rl_driver::reward_request_of(const iteration_state& s, size_t begin,
                                            size_t end) const {
  auto slice = [&](const auto& v) {
    using V = std::decay_t<decltype(v)>;
    return V(v.begin() + static_cast<long>(begin), v.begin() + static_cast<long>(end));
  };
  reward_request req;
  req.prompts = slice(s.prompts);
  req.responses = slice(s.responses);
  if (!s.last_turn_begin.empty()) // NOTE [episodes]: the last turn after all before it
    for (size_t i = 0; i < req.responses.size(); ++i) {
      auto& resp = req.responses[i];
      auto cut = resp.begin() + static_cast<long>(s.last_turn_begin[begin + i]);
      req.prompts[i].insert(req.prompts[i].end(), resp.begin(), cut);
      resp.erase(resp.begin(), cut);
    }
  req.answers = slice(s.answers);
  req.metadata = slice(s.metadata);
  auto b = value_or_throw(collate_sequences(req.prompts, req.responses, ctx_.pad));
  value_or_throw(req.batch.set("input_ids", value_or_throw(b.get("input_ids"))));
  value_or_throw(req.batch.set("attention_mask", value_or_throw(b.get("attention_mask"))));
  return req;
}

namespace {

// The replies of the parts, joined along the rows; "token_scores" [b, Lr]
// are right-padded with zeros to the longest part's Lr first.
runtime::tensor_batch join_parts(std::vector<runtime::tensor_batch>& parts) {
  runtime::tensor_batch out;
  for (const auto& [key, first] : parts.front().tensors()) {
    std::vector<at::Tensor> xs;
    int64_t width = 0;
    for (auto& p : parts)
      xs.push_back(value_or_throw(p.get(key)));
    for (auto& x : xs)
      width = x.dim() == 2 ? std::max(width, x.size(1)) : width;
    for (auto& x : xs)
      if (x.dim() == 2 && x.size(1) < width)
        x = torch::nn::functional::pad(
            x, torch::nn::functional::PadFuncOptions({0, width - x.size(1)}));
    value_or_throw(out.set(key, torch::cat(xs, 0)));
  }
  return out;
}

} // namespace

void rl_driver::absorb_scores(iteration_state& s, runtime::tensor_batch& reply) const {
  s.scores = value_or_throw(reply.get("scores"));
  // Each backend's own scores (NOTE [reward backends]): "rule_scores" →
  // critic/rule_score/mean, "model_scores" → critic/model_score/mean; a
  // backend's extras: "extra/<name>" → reward/extra/<name> (the mean).
  const std::string suffix = "_scores", extra = "extra/";
  for (const auto& [key, t] : reply.tensors()) {
    if (key.size() > suffix.size() && key != "token_scores" &&
        key.compare(key.size() - suffix.size(), suffix.size(), suffix) == 0)
      s.m["critic/" + key.substr(0, key.size() - 1) + "/mean"] = t.mean().item<double>();
    if (key.rfind(extra, 0) == 0)
      s.m["reward/" + key] = t.to(torch::kDouble).mean().item<double>();
  }
  if (auto dense = reply.get("token_scores")) {
    std::vector<std::vector<float>> rows(s.responses.size());
    auto d = dense->to(torch::kFloat).contiguous();
    for (size_t i = 0; i < rows.size(); ++i) {
      auto n = std::min<int64_t>(static_cast<int64_t>(s.responses[i].size()), d.size(1));
      auto row = d[static_cast<int64_t>(i)];
      rows[i].assign(row.data_ptr<float>(), row.data_ptr<float>() + n);
    }
    s.token_score_rows = std::move(rows);
    place_token_scores(s);
  }
}

expected<void> rl_driver::reward(iteration_state& s) {
  if (s.scores.defined()) // scored during gen (NOTE [dynamic sampling])
    return {};
  if (!episodic())
    return score_now(s);
  const bool ask = ctx_.cfg->rl.environment.score != episode_score::environment;
  if (ask)
    if (auto ok = score_now(s); !ok)
      return ok;
  absorb_episode_scores(s, ask);
  return {};
}

// NOTE [episodes]: the environment's outcome rewards are the scores
// (environment), or added to the reward role's (sum); its shaping rewards
// join the dense token scores. The reward role scored each episode's last
// turn, so its token scores start there.
void rl_driver::absorb_episode_scores(iteration_state& s, bool reward_role_scored) const {
  const auto rows = s.responses.size();
  if (reward_role_scored)
    for (size_t i = 0; i < s.token_score_rows.size() && i < rows; ++i) {
      auto& row = s.token_score_rows[i];
      row.insert(row.begin(), s.last_turn_begin[i], 0.0f);
    }
  const auto how = ctx_.cfg->rl.environment.score;
  if (how == episode_score::reward) {
    place_token_scores(s);
    return;
  }
  auto env =
      torch::tensor(std::vector<float>(s.env_rewards.begin(), s.env_rewards.end()), torch::kFloat);
  s.scores = reward_role_scored ? s.scores + env : env;
  s.m["critic/env_score/mean"] = env.mean().item<double>();
  if (!s.shaping_rows.empty()) {
    s.token_score_rows.resize(rows);
    for (size_t i = 0; i < rows; ++i) {
      auto& row = s.token_score_rows[i];
      const auto& add = s.shaping_rows[i];
      row.resize(std::max(row.size(), add.size()), 0.0f);
      for (size_t j = 0; j < add.size(); ++j)
        row[j] += add[j];
    }
  }
  place_token_scores(s);
}

expected<void> rl_driver::score_now(iteration_state& s) {
  if (!s.pending_scores.empty()) {
    stopwatch wait;
    std::vector<runtime::tensor_batch> parts;
    double busy = 0;
    for (auto& collect : s.pending_scores) {
      auto part = collect();
      if (!part)
        return part.error();
      busy += part->busy_s;
      parts.push_back(std::move(part->value));
    }
    s.pending_scores.clear();
    ctx_.roles_busy_s += busy;
    s.m["timing_s/reward_hidden"] = std::max(0.0, busy - wait.seconds());
    auto joined = join_parts(parts);
    absorb_scores(s, joined);
    return {};
  }
  auto sc = ask_served<runtime::tensor_batch>(
      ctx_, cast_.handle_as<reward_actor>(role_id::reward), request_kind::compute, "reward: score",
      reward_atom::value, reward_request_of(s, 0, s.responses.size()));
  if (!sc)
    return sc.error();
  absorb_scores(s, *sc);
  return {};
}

// ReMax (Li et al. 2023): the baseline of a prompt's samples is the reward
// of the policy's greedy response to it, generated by the same weights.
expected<void> rl_driver::baseline(iteration_state& s) {
  const auto& r = ctx_.cfg->rl;
  auto reqs = gen_requests(s.it);
  for (auto& q : reqs) {
    q.sampling.temperature = 0;
    q.sampling.top_k = 0;
    q.sampling.top_p = 1;
    q.sampling.n = 1;
  }
  auto outs = generate(ctx_, rollout(), std::move(reqs), "rollout: baseline");
  if (!outs)
    return outs.error();
  iteration_state greedy;
  auto rows = rows_of(s.it);
  for (size_t i = 0; i < outs->size(); ++i)
    take_samples(greedy, (*outs)[i], rows[i]);
  auto sc = ask_served<runtime::tensor_batch>(
      ctx_, cast_.handle_as<reward_actor>(role_id::reward), request_kind::compute,
      "reward: baseline", reward_atom::value,
      reward_request_of(greedy, 0, greedy.responses.size()));
  if (!sc)
    return sc.error();
  auto scores = value_or_throw(sc->get("scores")).to(torch::kFloat);
  if (auto dense = sc->get("token_scores")) // dense scores count by their sum, as the samples'
    scores = scores + dense->to(torch::kFloat).sum(1);
  s.baseline_scores = scores.repeat_interleave(r.samples_per_prompt);
  s.m["critic/baseline_score/mean"] = scores.mean().item<double>();
  return {};
}

// NOTE [groups of one]: named once per iteration, with how many there are.
void rl_driver::warn_groups_of_one(const iteration_state& s, const at::Tensor& group_ids) const {
  auto alone = value_or_throw(kernels::singleton_groups(group_ids));
  if (alone.numel() == 0)
    return;
  const auto n = ctx_.cfg->rl.samples_per_prompt;
  auto first = alone[0].item<int64_t>();
  auto rows = rows_of(s.it);
  auto text = rows.at(static_cast<size_t>(first / n)).prompt;
  if (text.size() > 80)
    text = text.substr(0, 77) + "...";
  ctx_.log->warn("rl iteration " + std::to_string(s.it + 1) + ": " + std::to_string(alone.numel()) +
                 " sample(s) alone in their group (first: the prompt \"" + text +
                 "\"): no group baseline, the advantage is the raw score (mean 0, std 1)");
}

expected<void> rl_driver::adv(iteration_state& s) {
  const auto& r = ctx_.cfg->rl;
  auto& m = s.m;
  const auto& mask = s.mask;
  double beta = progress_.beta;
  double beta_reward = (algo_.use_reference && !algo_.kl_in_loss) ? beta : 0.0;
  auto tr = value_or_throw(kernels::token_level_rewards(s.scores, s.old_lp, s.ref_lp, mask,
                                                        beta_reward, algo_.kl_estimator));
  if (s.token_scores.defined()) // a reward's dense scores join the token rewards
    tr.rewards = tr.rewards + s.token_scores * mask;
  auto rows = static_cast<int64_t>(s.responses.size());
  kernels::advantage_inputs in;
  // Outcome estimators (grpo, rloo, ...) read one score a sequence: a
  // reward's dense scores count by their sum, as in the token rewards.
  in.scores = s.token_scores.defined() ? s.scores + (s.token_scores * mask).sum(1) : s.scores;
  in.token_rewards = tr.rewards;
  in.values = s.values;
  in.mask = mask;
  in.group_ids = value_or_throw(kernels::contiguous_group_ids(rows, r.samples_per_prompt));
  in.gamma = r.gamma;
  in.lam = r.lam;
  in.whiten = r.whiten_advantages;
  in.norm_by_std = r.norm_adv_by_std;
  in.baseline_scores = s.baseline_scores;
  using kernels::advantage_estimator;
  if (algo_.advantage == advantage_estimator::grpo ||
      algo_.advantage == advantage_estimator::rloo ||
      algo_.advantage == advantage_estimator::reinforce_pp_baseline)
    warn_groups_of_one(s, in.group_ids);
  auto a = value_or_throw(kernels::estimate_advantages(algo_.advantage, in));
  if (r.staleness > 0)
    correct_stale_tokens(s, a.advantages);
  value_or_throw(s.batch.set("advantages", a.advantages.to(torch::kFloat)));
  value_or_throw(s.batch.set("returns", a.returns.to(torch::kFloat)));
  // KL of the batch: per-sequence sum, averaged (the adaptive controller's input).
  s.kl_mean = (tr.kl * mask).sum(1).mean().item<double>();
  m["actor/reward_kl_penalty"] = masked_mean_of(tr.kl, mask);
  m["actor/reward_kl_penalty_coeff"] = beta;
  m["critic/score/mean"] = s.scores.mean().item<double>();
  m["critic/score/max"] = s.scores.max().item<double>();
  m["critic/score/min"] = s.scores.min().item<double>();
  m["critic/rewards/mean"] = (tr.rewards * mask).sum(1).mean().item<double>();
  m["critic/advantages/mean"] = masked_mean_of(a.advantages, mask);
  m["critic/advantages/max"] = (a.advantages.masked_fill(mask == 0, -1e30)).max().item<double>();
  m["critic/advantages/min"] = (a.advantages.masked_fill(mask == 0, 1e30)).min().item<double>();
  m["critic/returns/mean"] = masked_mean_of(a.returns, mask);
  if (s.values.defined())
    m["critic/values/mean"] = masked_mean_of(s.values, mask);
  m["response_length/mean"] = mask.sum(1).mean().item<double>();
  m["response_length/max"] = mask.sum(1).max().item<double>();
  // The adaptive controller's β for the next iteration, committed when this
  // one completes (the policy's KL loss already uses it).
  s.beta_next = algo_.use_reference && algo_.adaptive_kl
                    ? kernels::adaptive_kl_coef(beta, s.kl_mean, r.kl.target, rows, r.kl.horizon)
                    : beta;
  return {};
}

// NOTE [staleness]: a token sampled by an older version than the one that
// trains on it is corrected by the capped importance weight min(π_policy /
// π_behaviour, stale_is_cap) (its behaviour log-prob taken when it was
// sampled); a token of the current version keeps weight 1. The metrics are
// the distribution of the tokens' lags (versions behind).
void rl_driver::correct_stale_tokens(iteration_state& s, at::Tensor& advantages) const {
  const auto& r = ctx_.cfg->rl;
  auto& m = s.m;
  const auto& mask = s.mask;
  auto lag = (static_cast<double>(s.it) - s.token_versions) * mask; // 0 off the responses
  const double lag_max = lag.max().item<double>();
  m["rollout/staleness"] = lag_max; // the batch's oldest token
  m["rollout/staleness/mean"] = masked_mean_of(lag, mask);
  m["rollout/staleness/max"] = lag_max;
  for (int64_t d = 0; d <= r.staleness; ++d)
    m["rollout/staleness/frac_" + std::to_string(d)] =
        masked_mean_of((lag == static_cast<double>(d)).to(mask.scalar_type()), mask);
  auto stale = (lag > 0.5).to(mask.scalar_type());
  if (stale.sum().item<double>() == 0)
    return;
  auto w = value_or_throw(
      kernels::truncated_importance_weights(s.old_lp, s.eng_lp, stale, r.stale_is_cap));
  auto weights = torch::where(stale > 0, w.weights, torch::ones_like(w.weights));
  advantages = advantages * weights;
  m["rollout/stale_is_weight/mean"] = masked_mean_of(w.weights, stale);
  m["rollout/stale_is_weight/capped"] = w.capped_fraction;
}

expected<void> rl_driver::update_critic(iteration_state& s) {
  const auto& r = ctx_.cfg->rl;
  s.updating = true;
  train::critic_update_options o;
  o.epochs = r.epochs;
  o.minibatches = r.minibatches;
  o.value_clip = r.critic.value_clip;
  o.loss_agg = r.loss_agg;
  o.loss_scale_factor = r.loss_scale_factor;
  o.shuffle_seed =
      mix_seed({static_cast<uint64_t>(ctx_.cfg->run.seed), 61, static_cast<uint64_t>(s.it)});
  auto res = ask_served<train::metric_map>(ctx_, trainer(role_id::critic), request_kind::compute, "critic: update_critic",
                                           train::update_critic_atom::value, s.batch, o);
  if (!res)
    return res.error();
  s.m.insert(res->begin(), res->end());
  return {};
}

expected<void> rl_driver::update_actor(iteration_state& s) {
  const auto& r = ctx_.cfg->rl;
  s.updating = true;
  policy_moved_ = true;
  train::policy_update_options o;
  o.epochs = r.epochs;
  o.minibatches = r.minibatches;
  o.loss = actor_loss_spec(r, (algo_.use_reference && algo_.kl_in_loss) ? s.beta_next : 0.0);
  o.temperature = r.generation.temperature;
  o.lr = r.actor_optim.lr;
  o.shuffle_seed =
      mix_seed({static_cast<uint64_t>(ctx_.cfg->run.seed), 62, static_cast<uint64_t>(s.it)});
  auto res = ask_served<train::metric_map>(ctx_, trainer(role_id::policy), request_kind::compute, "policy: update_actor",
                                           train::update_policy_atom::value, s.batch, o);
  if (!res)
    return res.error();
  s.m.insert(res->begin(), res->end());
  // With the engine's old log-probs the contract is measured against the
  // update's first forward (NOTE [first-minibatch contract] in
  // actors/train/train_engine.hpp), its first minibatch's tokens.
  if (!algo_.policy_old_logprobs)
    report_rollout_corr(s.m, res->at("actor/first_minibatch/logprob_abs_diff_mean"),
                        res->at("actor/first_minibatch/logprob_abs_diff_max"),
                        res->at("actor/first_minibatch/ppo_kl"));
  return {};
}

// The batches sampled ahead must not see the new weights: collect them
// first (unless the rollout takes new versions in flight).
expected<void> rl_driver::gen_wait(iteration_state& s) {
  return collect_ahead(s.it + 1, std::numeric_limits<int64_t>::max());
}

expected<void> rl_driver::weight_sync(iteration_state& s) {
  // NOTE [supervision]: a rollout restarted after the version went out
  // receives it again (a trainer publishes a version once).
  if (auto p = ctx_.published.find("rl"); p != ctx_.published.end() && p->second == s.it + 1) {
    policy_moved_ = false;
    return resend_weights(s.it + 1);
  }
  auto ok = sync_weights(ctx_.self, ctx_, "rl", trainer(role_id::policy), rollout(), s.it + 1);
  if (ctx_.published["rl"] == s.it + 1)
    policy_moved_ = false;
  return ok;
}

expected<void> rl_driver::evaluate(iteration_state& s) {
  return detail::evaluate(ctx_.self, ctx_, rollout(), s.m, "rl", s.it + 1);
}

// Co-located offload (NOTE [rl iteration]): a role's idle state once its
// last phase of the iteration is done.
expected<void> rl_driver::release_after(iteration_state& s, std::string_view phase) {
  if (!ctx_.cfg->placement.offload)
    return {};
  stopwatch t;
  // The rollout keeps its KV pool while the next batch is generated ahead;
  // with a greedy baseline (remax) the rollout and the reward are idle only
  // after the baseline phase, which asks them again.
  auto keep = [&](role_id r) { return r == role_id::rollout && ahead_in_flight(); };
  auto keep_for_baseline = [&](role_id r) {
    return keep(r) || (algo_.greedy_baseline && (r == role_id::rollout || r == role_id::reward));
  };
  std::optional<int64_t> total;
  caf::error failed;
  auto release = [&](std::string_view after, const std::function<bool(role_id)>& keeping) {
    auto freed = cast_.release_after(after, keeping, ctx_.roles_busy_s);
    if (!freed)
      failed = freed.error();
    else if (*freed)
      total = total.value_or(0) + **freed;
    return !failed;
  };
  if (phase == "baseline") {
    if (release("gen", keep))
      release("reward", keep);
  } else {
    release(phase, keep_for_baseline);
  }
  if (failed)
    return failed;
  if (!total)
    return {};
  s.m["timing_s/offload"] += t.seconds();
  s.m["perf/offloaded_bytes"] += static_cast<double>(*total);
  return {};
}

} // namespace troupe::actors::rl::detail
