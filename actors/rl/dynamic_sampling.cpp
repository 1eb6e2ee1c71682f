// NOTE [dynamic sampling] (DAPO, Yu et al. 2025): a group whose samples all
// score the same has advantage 0 under every group estimator, so it spends
// a batch slot and teaches nothing. With rl.dynamic_sampling.enabled the gen
// phase scores its samples at once (the reward phase then has nothing left
// to do), keeps the groups whose sequence scores (the score plus a reward's
// dense scores) differ, and while fewer than prompts_per_iteration remain,
// generates and scores another prompts_per_iteration prompts (a refill
// round: refill_requests), up to max_rounds rounds. The batch is the first
// prompts_per_iteration kept groups in the order they were generated; past
// the bound, dropped groups complete it (in order), so the batch always has
// its configured shape. Metrics: rollout/dynamic_sampling/rounds,
// groups_generated, groups_dropped, groups_padded (dropped groups in the
// batch) and refill_s (the refills' wall time, part of timing_s/gen).
// Everything is a function of (run seed, iteration): a resumed run repeats it.

#include "actors/rl/rl_driver.hpp"

#include "runtime/torch_guard.hpp"

#include <torch/torch.h>

namespace troupe::actors::rl::detail {

namespace {

// A sample's sequence score: its score plus its dense scores' sum.
std::vector<double> sequence_scores(const iteration_state& s) {
  auto scores = s.scores.to(torch::kDouble).contiguous();
  std::vector<double> out(scores.data_ptr<double>(), scores.data_ptr<double>() + scores.numel());
  for (size_t i = 0; i < s.token_score_rows.size() && i < out.size(); ++i)
    for (float x : s.token_score_rows[i])
      out[i] += x;
  return out;
}

// `from`'s samples after `to`'s (both scored).
void append_samples(iteration_state& to, iteration_state&& from) {
  auto move_all = [](auto& a, auto& b) {
    a.insert(a.end(), std::make_move_iterator(b.begin()), std::make_move_iterator(b.end()));
  };
  const bool dense = !to.token_score_rows.empty() || !from.token_score_rows.empty();
  if (dense) { // a reward without dense scores for some samples: zeros
    to.token_score_rows.resize(to.responses.size());
    from.token_score_rows.resize(from.responses.size());
  }
  move_all(to.prompts, from.prompts);
  move_all(to.responses, from.responses);
  move_all(to.engine_lp, from.engine_lp);
  move_all(to.answers, from.answers);
  move_all(to.metadata, from.metadata);
  move_all(to.token_score_rows, from.token_score_rows);
  to.scores = torch::cat({to.scores.to(torch::kFloat), from.scores.to(torch::kFloat)});
}

// Keeps samples `idx` of `s`, in that order.
void keep_samples(iteration_state& s, const std::vector<int64_t>& idx) {
  auto pick = [&](auto& v) {
    std::decay_t<decltype(v)> out;
    out.reserve(idx.size());
    for (auto i : idx)
      out.push_back(std::move(v[static_cast<size_t>(i)]));
    v = std::move(out);
  };
  pick(s.prompts);
  pick(s.responses);
  pick(s.engine_lp);
  pick(s.answers);
  pick(s.metadata);
  if (!s.token_score_rows.empty())
    pick(s.token_score_rows);
  s.scores = s.scores.index_select(0, torch::tensor(idx, torch::kLong));
}

} // namespace

expected<void> rl_driver::dynamic_sampling(iteration_state& s) {
  const auto& r = ctx_.cfg->rl;
  const auto n = static_cast<size_t>(r.samples_per_prompt);
  const auto want = static_cast<size_t>(r.prompts_per_iteration);
  if (auto ok = score_now(s); !ok)
    return ok;
  stopwatch refill;
  int64_t round = 0;
  // Groups (by first sample) whose scores differ, and those that do not.
  std::vector<size_t> kept, dropped;
  size_t classified = 0;
  auto classify = [&] {
    auto seq = sequence_scores(s);
    for (; classified + n <= seq.size(); classified += n) {
      auto [lo, hi] = std::minmax_element(seq.begin() + static_cast<long>(classified),
                                          seq.begin() + static_cast<long>(classified + n));
      (*lo == *hi ? dropped : kept).push_back(classified);
    }
  };
  classify();
  for (; kept.size() < want && round < r.dynamic_sampling.max_rounds; ++round) {
    std::vector<example> rows;
    auto outs = generate(ctx_, rollout(), refill_requests(s.it, round, rows), "rollout: refill");
    if (!outs)
      return outs.error();
    iteration_state more;
    more.it = s.it;
    for (size_t i = 0; i < outs->size(); ++i)
      take_samples(more, (*outs)[i], rows[i]);
    if (auto ok = score_now(more); !ok)
      return ok;
    append_samples(s, std::move(more));
    classify();
  }
  const double groups = static_cast<double>(classified / n);
  s.m["rollout/dynamic_sampling/rounds"] = static_cast<double>(round);
  s.m["rollout/dynamic_sampling/groups_generated"] = groups;
  s.m["rollout/dynamic_sampling/groups_dropped"] = static_cast<double>(dropped.size());
  s.m["rollout/dynamic_sampling/refill_s"] = round > 0 ? refill.seconds() : 0.0;
  std::vector<size_t> batch(kept.begin(), kept.begin() + static_cast<long>(std::min(want, kept.size())));
  size_t padded = 0;
  for (size_t i = 0; batch.size() < want && i < dropped.size(); ++i, ++padded)
    batch.push_back(dropped[i]);
  std::sort(batch.begin(), batch.end()); // generation order
  s.m["rollout/dynamic_sampling/groups_padded"] = static_cast<double>(padded);
  std::vector<int64_t> idx;
  for (auto g : batch)
    for (size_t j = 0; j < n; ++j)
      idx.push_back(static_cast<int64_t>(g + j));
  keep_samples(s, idx);
  return {};
}

} // namespace troupe::actors::rl::detail
