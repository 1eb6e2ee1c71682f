// The dpo stage: direct preference optimisation of the policy.
//
// NOTE [dpo stage]: the policy and a frozen reference both start from
// dpo.init (the sft stage's model, or the base model). Each step draws
// dpo.batch_size preference pairs (data.preference_file, or pairs built from
// the task's rows) from a seeded stream, as the rm stage does; a pair's
// sequences are prompt + chosen and prompt + rejected, and a sequence's
// log-prob is the sum of its response tokens' (IPO: their mean, as TRL).
// The reference's log-probs of a pair are computed once — the first time a
// step or the held-out evaluation needs the pair — and kept by the driver;
// the policy's step (train_engine::dpo_step) takes them with the batch, so a
// data-parallel policy splits pairs and the reference is asked nothing after
// it. The loss is dpo.loss_type (kernels/preference.hpp); the step logs TRL's
// names (rewards/chosen, rewards/rejected, rewards/accuracies,
// rewards/margins, logps/*) and the evaluation the same over the held-out
// pairs under val/ (val/rewards/accuracies: the fraction of held-out pairs
// the policy's implicit reward orders as labelled). The loop, checkpoints
// and resume are the supervised stages' (NOTE [supervised stages]): a resumed
// run asks the reference again for the pairs it needs, and gets the same
// log-probs, so it continues exactly.

#include "actors/rl/job_internal.hpp"

#include "kernels/preference.hpp"
#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <unordered_map>

namespace troupe::actors::rl::detail {

namespace {

// A pair's sequence log-probs under the reference: (chosen, rejected).
using ref_cache = std::unordered_map<int64_t, std::pair<float, float>>;

// The pairs `rows` as 2B sequences — every chosen one, then every rejected
// one — in one sequence batch (NOTE [sequence batches]).
expected<runtime::tensor_batch> both_sequences(job_context& ctx,
                                               const std::vector<preference_pair>& rows) {
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::vector<int64_t>> responses(rows.size() * 2);
  for (size_t i = 0; i < rows.size(); ++i) {
    auto prompt = ctx.enc.prompt(rows[i].prompt, rows[i].messages);
    if (!prompt)
      return prompt.error();
    prompts.push_back(std::move(*prompt));
    responses[i] = ctx.enc.response(rows[i].chosen);
    responses[rows.size() + i] = ctx.enc.response(rows[i].rejected);
  }
  auto all = prompts;
  all.insert(all.end(), prompts.begin(), prompts.end());
  return collate_sequences(all, responses, ctx.pad);
}

// The sequence log-probs [2B] of `seq` under `role`'s model.
expected<at::Tensor> sequence_logps(job_context& ctx, const train::engine_actor& role,
                                    const std::string& what, const runtime::tensor_batch& seq) {
  auto lp = ask_served<runtime::tensor_batch>(ctx, role, request_kind::compute, what,
                                              train::log_probs_atom::value, seq, 1.0, false);
  if (!lp)
    return lp.error();
  auto tokens = lp->get("log_probs");
  if (!tokens)
    return tokens.error();
  auto mask = seq.get("response_mask");
  if (!mask)
    return mask.error();
  return kernels::sequence_log_probs(*tokens, *mask,
                                     kernels::length_averaged(ctx.cfg->dpo.loss_type));
}

class dpo_driver {
public:
  dpo_driver(job_context& ctx, const cast& roles)
      : ctx_(ctx), policy_(roles.handle_as<train::engine_actor>(role_id::policy)),
        reference_(roles.handle_as<train::engine_actor>(role_id::reference)) {}

  expected<train::metric_map> step(int64_t step) {
    const auto& d = ctx_.cfg->dpo;
    auto idx = preference_indices(*ctx_.cfg, ctx_.data, 13u, step, d.batch_size);
    auto rows = ctx_.data.preferences.rows(idx);
    if (!rows)
      return rows.error();
    auto batch = batch_of(*rows, idx, train_refs_, "reference: dpo train pairs");
    if (!batch)
      return batch.error();
    train::dpo_step_options o;
    o.loss = loss_options();
    return ask<train::metric_map>(ctx_.self, policy_, ctx_.timeout_of(request_kind::compute),
                                  "policy: dpo step", train::dpo_step_atom::value, *batch, o);
  }

  // The held-out pairs' metrics under val/, a batch_size of pairs at a time.
  expected<void> evaluate(train::metric_map& m) {
    const auto& pairs = ctx_.data.eval_preferences;
    const auto n = static_cast<int64_t>(pairs.size());
    std::vector<at::Tensor> chosen, rejected, ref_chosen, ref_rejected;
    for (int64_t b = 0; b < n; b += ctx_.cfg->dpo.batch_size) {
      auto e = std::min(n, b + ctx_.cfg->dpo.batch_size);
      std::vector<preference_pair> rows(pairs.begin() + b, pairs.begin() + e);
      std::vector<int64_t> idx(static_cast<size_t>(e - b));
      std::iota(idx.begin(), idx.end(), b);
      auto seq = both_sequences(ctx_, rows);
      if (!seq)
        return seq.error();
      auto refs = references(*seq, idx, eval_refs_, "reference: dpo held-out pairs");
      if (!refs)
        return refs.error();
      auto lp = sequence_logps(ctx_, policy_, "policy: dpo eval", *seq);
      if (!lp)
        return lp.error();
      const auto k = e - b;
      chosen.push_back(lp->narrow(0, 0, k));
      rejected.push_back(lp->narrow(0, k, k));
      ref_chosen.push_back(refs->first);
      ref_rejected.push_back(refs->second);
    }
    if (chosen.empty())
      return {};
    auto r = kernels::dpo_loss(torch::cat(chosen), torch::cat(rejected), torch::cat(ref_chosen),
                               torch::cat(ref_rejected), loss_options());
    if (!r)
      return r.error();
    auto margin = r->chosen_rewards - r->rejected_rewards;
    m["val/dpo/loss"] = r->loss.item<double>();
    m["val/rewards/chosen"] = r->chosen_rewards.mean().item<double>();
    m["val/rewards/rejected"] = r->rejected_rewards.mean().item<double>();
    m["val/rewards/accuracies"] = (margin > 0).to(torch::kDouble).mean().item<double>();
    m["val/rewards/margins"] = margin.mean().item<double>();
    return {};
  }

private:
  kernels::dpo_options loss_options() const {
    const auto& d = ctx_.cfg->dpo;
    return {d.beta, d.loss_type, d.label_smoothing};
  }

  // The reference's log-probs (chosen [k], rejected [k]) of pairs `idx`
  // (their sequences `seq`), asking it only for those not yet in `cache`.
  expected<std::pair<at::Tensor, at::Tensor>> references(const runtime::tensor_batch& seq,
                                                         const std::vector<int64_t>& idx,
                                                         ref_cache& cache,
                                                         const std::string& what) {
    const auto k = static_cast<int64_t>(idx.size());
    bool all_known = std::all_of(idx.begin(), idx.end(), [&](int64_t i) { return cache.count(i); });
    if (!all_known) {
      auto lp = sequence_logps(ctx_, reference_, what, seq);
      if (!lp)
        return lp.error();
      auto v = lp->to(torch::kFloat).contiguous();
      const float* p = v.data_ptr<float>();
      for (int64_t j = 0; j < k; ++j)
        cache.emplace(idx[static_cast<size_t>(j)], std::pair{p[j], p[k + j]});
    }
    std::vector<float> c, r;
    for (auto i : idx) {
      c.push_back(cache.at(i).first);
      r.push_back(cache.at(i).second);
    }
    return std::pair{torch::tensor(c, torch::kFloat), torch::tensor(r, torch::kFloat)};
  }

  expected<runtime::tensor_batch> batch_of(const std::vector<preference_pair>& rows,
                                           const std::vector<int64_t>& idx, ref_cache& cache,
                                           const std::string& what) {
    auto seq = both_sequences(ctx_, rows);
    if (!seq)
      return seq.error();
    auto refs = references(*seq, idx, cache, what);
    if (!refs)
      return refs.error();
    auto out = preference_layout(*seq, static_cast<int64_t>(rows.size()));
    if (!out)
      return out.error();
    if (auto ok = out->set("ref_chosen_logps", refs->first); !ok)
      return ok.error();
    if (auto ok = out->set("ref_rejected_logps", refs->second); !ok)
      return ok.error();
    return out;
  }

  job_context& ctx_;
  train::engine_actor policy_, reference_;
  ref_cache train_refs_, eval_refs_;
};

expected<stage_steps> dpo_steps(job_context& ctx, const cast& roles) {
  auto driver = std::make_shared<dpo_driver>(ctx, roles);
  stage_steps out;
  out.train = [driver](int64_t step) { return driver->step(step); };
  out.evaluate = [driver](train::metric_map& m, int64_t) { return driver->evaluate(m); };
  return out;
}

} // namespace

expected<stage_summary> run_dpo_stage(job_context& ctx) {
  const auto& d = ctx.cfg->dpo;
  supervised_stage st;
  st.id = stage_id::dpo;
  st.name = "dpo";
  st.trainer = role_id::policy;
  st.steps = d.steps;
  st.eval_every = d.eval_every;
  st.init_dir = d.init == model_source::base ? ctx.base_dir : ctx.model_dir("sft");
  return run_supervised(ctx, st, dpo_steps);
}

} // namespace troupe::actors::rl::detail
