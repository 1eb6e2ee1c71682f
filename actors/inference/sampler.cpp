#include "actors/inference/sampler.hpp"

#include "kernels/cpu/softmax_row.hpp"
#include "runtime/seeded_random.hpp"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>

namespace troupe::actors::inference {

namespace {

using runtime::splitmix64;

uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

std::string num(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

/// Draws an index from `weights` [0, vocab) (unnormalised, >= 0) restricted
/// to `idx` (or all indices when `idx` is empty) by inverse CDF.
int64_t draw(const float* weights, int64_t vocab, const std::vector<int64_t>& idx, double total,
             double u) {
  double target = u * total;
  double acc = 0;
  if (idx.empty()) {
    int64_t last = -1;
    for (int64_t i = 0; i < vocab; ++i) {
      if (weights[i] <= 0)
        continue;
      acc += weights[i];
      last = i;
      if (acc > target)
        return last;
    }
    return last; // rounding: the last token with mass
  }
  for (auto i : idx) {
    acc += weights[i];
    if (acc > target)
      return i;
  }
  return idx.back();
}

/// Row r's token: argmax for greedy, else a draw from the (top-k / top-p
/// truncated) weights. `weights` holds exp(scale · (x − max)) for the row.
int64_t pick(const sampling_params& p, const kernels::detail::softmax_row_stats& stats,
             const float* weights, int64_t vocab, rng_stream& stream, std::vector<int64_t>& idx) {
  if (p.temperature == 0)
    return stats.argmax;
  idx.clear();
  double kept = stats.sum;
  bool truncate_k = p.top_k > 0 && p.top_k < vocab;
  bool truncate_p = p.top_p < 1.0;
  if (truncate_k || truncate_p) {
    idx.resize(static_cast<size_t>(vocab));
    std::iota(idx.begin(), idx.end(), 0);
    // Most likely first; ties by lower id, so the order is deterministic.
    auto before = [&](int64_t a, int64_t b) {
      return weights[a] > weights[b] || (weights[a] == weights[b] && a < b);
    };
    if (truncate_k) {
      std::nth_element(idx.begin(), idx.begin() + p.top_k - 1, idx.end(), before);
      idx.resize(static_cast<size_t>(p.top_k));
    }
    std::sort(idx.begin(), idx.end(), before);
    kept = 0;
    for (auto i : idx)
      kept += weights[i];
    if (truncate_p) {
      double acc = 0;
      size_t keep = 0;
      while (keep < idx.size()) {
        acc += weights[idx[keep]];
        ++keep;
        if (acc >= p.top_p * kept)
          break;
      }
      idx.resize(keep);
      kept = acc;
    }
  }
  return draw(weights, vocab, idx, kept, stream.uniform());
}

} // namespace

expected<void> validate(const sampling_params& p, int64_t vocab_size) {
  std::vector<std::string> bad;
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature))
    bad.push_back("sampling.temperature: expected a number >= 0, got " + num(p.temperature));
  if (p.top_k < 0)
    bad.push_back("sampling.top_k: expected an integer >= 0 (0 = off), got " +
                  std::to_string(p.top_k));
  if (!(p.top_p > 0 && p.top_p <= 1))
    bad.push_back("sampling.top_p: expected a number in (0, 1], got " + num(p.top_p));
  if (p.n < 1)
    bad.push_back("sampling.n: expected an integer >= 1, got " + std::to_string(p.n));
  if (p.max_tokens < 1)
    bad.push_back("sampling.max_tokens: expected an integer >= 1, got " +
                  std::to_string(p.max_tokens));
  for (size_t i = 0; i < p.stop_token_ids.size(); ++i)
    if (p.stop_token_ids[i] < 0 || p.stop_token_ids[i] >= vocab_size)
      bad.push_back("sampling.stop_token_ids[" + std::to_string(i) + "]: token " +
                    std::to_string(p.stop_token_ids[i]) + " outside the vocabulary [0, " +
                    std::to_string(vocab_size) + ")");
  if (auto err = make_error_list(errc::invalid_argument, bad))
    return err;
  return caf::unit;
}

rng_stream rng_stream::make(uint64_t seed, uint64_t index) {
  uint64_t x = seed ^ (0xd1b54a32d192ed03ULL * (index + 1));
  rng_stream r;
  r.s0 = splitmix64(x);
  r.s1 = splitmix64(x);
  if (r.s0 == 0 && r.s1 == 0)
    r.s1 = 1;
  return r;
}

double rng_stream::uniform() {
  uint64_t a = s0;
  uint64_t b = s1;
  uint64_t result = a + b;
  b ^= a;
  s0 = rotl(a, 24) ^ b ^ (b << 16);
  s1 = rotl(b, 37);
  return static_cast<double>(result >> 11) * 0x1.0p-53;
}

expected<std::vector<sampled_token>> sample(const at::Tensor& logits,
                                            const std::vector<const sampling_params*>& params,
                                            const std::vector<rng_stream*>& streams) {
  if (!logits.defined() || logits.dim() != 2 || logits.scalar_type() != at::kFloat ||
      !logits.device().is_cpu())
    return make_error(errc::invalid_argument, "sample: logits must be a float32 CPU tensor [R, V]");
  auto rows = logits.size(0);
  auto vocab = logits.size(1);
  if (static_cast<int64_t>(params.size()) != rows || static_cast<int64_t>(streams.size()) != rows)
    return make_error(errc::invalid_argument,
                      "sample: " + std::to_string(rows) + " logit rows but " +
                        std::to_string(params.size()) + " params and " +
                        std::to_string(streams.size()) + " streams");
  {
    std::vector<rng_stream*> sorted(streams);
    std::sort(sorted.begin(), sorted.end());
    bool null_stream = !sorted.empty() && sorted.front() == nullptr;
    if (null_stream || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      return make_error(errc::invalid_argument,
                        "sample: every row needs its own random stream (rows run in parallel)");
  }
  // Each row is one fused pass (kernels/cpu/softmax_row.hpp) on ATen's
  // thread pool: max, argmax and the normaliser of softmax(logits / T), and
  // for sampled rows the unnormalised probabilities to draw from. A row's
  // result depends only on its logits, params and stream.
  auto contiguous = logits.contiguous();
  const float* base = contiguous.data_ptr<float>();
  std::vector<sampled_token> out(static_cast<size_t>(rows));
  std::vector<char> bad(static_cast<size_t>(rows), 0);
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> weights;
    thread_local std::vector<int64_t> idx;
    for (int64_t r = begin; r < end; ++r) {
      const auto& p = *params[static_cast<size_t>(r)];
      const float* x = base + r * vocab;
      bool greedy = p.temperature == 0;
      auto scale = greedy ? 1.0f : static_cast<float>(1.0 / p.temperature);
      if (!greedy)
        weights.resize(static_cast<size_t>(vocab));
      auto stats = kernels::detail::softmax_row(x, vocab, scale, greedy ? nullptr : weights.data());
      if (stats.argmax < 0) {
        bad[static_cast<size_t>(r)] = 1;
        continue;
      }
      auto token = pick(p, stats, weights.data(), vocab, *streams[static_cast<size_t>(r)], idx);
      out[static_cast<size_t>(r)] = {
        token, static_cast<float>(kernels::detail::softmax_row_logprob(stats, x[token], scale))};
    }
  });
  for (int64_t r = 0; r < rows; ++r)
    if (bad[static_cast<size_t>(r)])
      return make_error(errc::internal, "sample: row " + std::to_string(r) +
                                          " has no finite logit (NaN or all -inf)");
  return out;
}

} // namespace troupe::actors::inference
