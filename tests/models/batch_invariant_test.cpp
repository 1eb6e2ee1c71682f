// The batch-invariant forward (NOTE [batch-invariant forward]): close to the
// ATen forward, and bit for bit the same for a token whatever its batch —
// alone, among 8 or 32, padded differently, as paged decode steps against
// a KV cache or in one trainer-style pass — and whatever the thread count.

#include "kernels/cpu/decode_isa.hpp"
#include "kernels/cpu/invariant.hpp"
#include "kernels/cpu/softmax_row.hpp"
#include "models/batch_invariant.hpp"
#include "models/llama.hpp"
#include "tests/models/tiny_llama.hpp"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <random>
#include <vector>

using namespace troupe;
using namespace troupe::models;

namespace {

// Head dim 10 and hidden 40: dot products with tails past the 8 lanes.
llama_config shape() {
  auto c = troupe::models::testing::tiny_config();
  c.hidden_size = 40;
  c.intermediate_size = 52;
  c.architecture = "Qwen2ForCausalLM";
  c.qkv_bias = true; // Qwen2: q/k/v biases, none on o
  return c;
}

llama_model model_of(const llama_config& c = shape()) {
  torch::manual_seed(3);
  auto m = make_llama(c, head_kind::lm);
  EXPECT_TRUE(m) << describe(m.error());
  torch::NoGradGuard no_grad;
  for (auto& p : (*m)->parameters()) // biases and norms away from 0 / 1 too
    p.add_(torch::randn_like(p) * 0.05);
  (*m)->eval();
  return *m;
}

std::vector<int64_t> tokens(int64_t n, uint64_t seed) {
  std::mt19937_64 rng{seed};
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (auto& t : out)
    t = static_cast<int64_t>(rng() % 61);
  return out;
}

/// A padded batch: row r holds seqs[r] starting at column lead[r].
struct padded {
  torch::Tensor ids, mask;
};
padded pad(const std::vector<std::vector<int64_t>>& seqs, const std::vector<int64_t>& lead,
           int64_t width) {
  const auto B = static_cast<int64_t>(seqs.size());
  padded p{torch::zeros({B, width}, torch::kLong), torch::zeros({B, width}, torch::kLong)};
  for (int64_t r = 0; r < B; ++r)
    for (size_t i = 0; i < seqs[static_cast<size_t>(r)].size(); ++i) {
      p.ids[r][lead[static_cast<size_t>(r)] + static_cast<int64_t>(i)] =
          seqs[static_cast<size_t>(r)][i];
      p.mask[r][lead[static_cast<size_t>(r)] + static_cast<int64_t>(i)] = 1;
    }
  return p;
}

/// The log-probs of one sequence's next tokens [n - 1] as computed inside a
/// batch of `batch` rows (others random, of random lengths) at row `row`,
/// starting at column `lead`.
torch::Tensor in_batch(const llama_model& m, const std::vector<int64_t>& seq, int64_t batch,
                       int64_t row, int64_t lead, uint64_t seed) {
  std::mt19937_64 rng{seed};
  std::vector<std::vector<int64_t>> seqs;
  std::vector<int64_t> leads;
  int64_t width = lead + static_cast<int64_t>(seq.size());
  for (int64_t r = 0; r < batch; ++r) {
    if (r == row) {
      seqs.push_back(seq);
      leads.push_back(lead);
      continue;
    }
    seqs.push_back(tokens(2 + static_cast<int64_t>(rng() % 30), rng()));
    leads.push_back(static_cast<int64_t>(rng() % 4));
    width = std::max(width, leads.back() + static_cast<int64_t>(seqs.back().size()));
  }
  auto p = pad(seqs, leads, width);
  auto lp = batch_invariant_log_probs(*m, p.ids, p.mask, 0.7, {});
  EXPECT_TRUE(lp) << describe(lp.error());
  return (*lp)[row].narrow(0, lead, static_cast<int64_t>(seq.size()) - 1).clone();
}

} // namespace

TEST(BatchInvariant, LogProbsMatchTheAtenForward) {
  auto m = model_of();
  auto p = pad({tokens(9, 1), tokens(14, 2), tokens(3, 3)}, {2, 0, 5}, 16);
  torch::NoGradGuard no_grad;
  auto logits = m->forward(p.ids, p.mask).narrow(1, 0, 15) / 0.7;
  auto want =
      torch::log_softmax(logits, -1).gather(2, p.ids.narrow(1, 1, 15).unsqueeze(2)).squeeze(2);
  auto real = (p.mask.narrow(1, 0, 15) * p.mask.narrow(1, 1, 15)).to(torch::kBool);
  auto got = batch_invariant_log_probs(*m, p.ids, p.mask, 0.7, {});
  ASSERT_TRUE(got) << describe(got.error());
  EXPECT_LT((got->masked_select(real) - want.masked_select(real)).abs().max().item<double>(), 2e-5);
  EXPECT_EQ(got->masked_select(real.logical_not()).abs().max().item<double>(), 0.0)
      << "padding gives 0";
}

TEST(BatchInvariant, OneSequenceAloneAndInBatchesOf8And32) {
  auto m = model_of();
  const auto seq = tokens(27, 9);
  auto alone = in_batch(m, seq, 1, 0, 0, 1);
  for (auto [batch, row, lead] :
       std::vector<std::array<int64_t, 3>>{{8, 3, 2}, {8, 7, 0}, {32, 0, 1}, {32, 19, 3}}) {
    SCOPED_TRACE("batch " + std::to_string(batch) + " row " + std::to_string(row));
    EXPECT_TRUE(torch::equal(alone, in_batch(m, seq, batch, row, lead, 100 + batch + row)));
  }
}

TEST(BatchInvariant, WantedRowsOnlyAndThreadCounts) {
  auto m = model_of();
  auto p = pad({tokens(20, 4), tokens(11, 5)}, {0, 4}, 20);
  auto all = batch_invariant_log_probs(*m, p.ids, p.mask, 1.0, {});
  ASSERT_TRUE(all);
  auto want = torch::zeros({2, 19});
  want.narrow(1, 10, 9).fill_(1);
  auto some = batch_invariant_log_probs(*m, p.ids, p.mask, 1.0, want);
  ASSERT_TRUE(some);
  EXPECT_TRUE(torch::equal(*some, *all * want)) << "the wanted entries, the same bits";
  // A row of padding only has no tokens to score; the others are unchanged.
  auto with_empty = pad({tokens(20, 4), tokens(11, 5), {}}, {0, 4, 0}, 20);
  auto three = batch_invariant_log_probs(*m, with_empty.ids, with_empty.mask, 1.0, {});
  ASSERT_TRUE(three) << describe(three.error());
  EXPECT_TRUE(torch::equal(three->narrow(0, 0, 2), *all));
  EXPECT_EQ((*three)[2].abs().sum().item<float>(), 0.0f);
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  auto one = batch_invariant_log_probs(*m, p.ids, p.mask, 1.0, {});
  at::set_num_threads(threads);
  ASSERT_TRUE(one);
  EXPECT_TRUE(torch::equal(*one, *all));
}

// The engine's side: a prompt prefilled in two chunks, then decode steps
// next to another request; each step's sampled-token log-prob (the
// sampler's row function) equals the trainer-style pass's bit for bit.
TEST(BatchInvariant, PagedDecodeStepsEqualTheTrainersPass) {
  auto m = model_of();
  m->set_batch_invariant(true);
  const int64_t bs = 4;
  auto cache = m->make_paged_cache(32, bs);
  auto seq = tokens(10, 7);  // prompt
  auto other = tokens(5, 8); // a neighbour request
  std::vector<int64_t> blocks_a{5, 2, 9, 0, 11}, blocks_b{3, 7, 1, 4};
  auto slot = [&](const std::vector<int64_t>& blocks, int64_t pos) {
    return blocks[static_cast<size_t>(pos / bs)] * bs + pos % bs;
  };
  auto table = [&](const std::vector<int64_t>& b, int64_t width) {
    auto t = torch::full({width}, -1, torch::kInt);
    for (size_t i = 0; i < b.size(); ++i)
      t[static_cast<int64_t>(i)] = static_cast<int>(b[i]);
    return t;
  };
  auto tables = torch::stack({table(blocks_a, 5), table(blocks_b, 5)});
  // Step 1: the first 6 prompt tokens of a, all of b.
  auto step = [&](std::vector<int64_t> ids_a, int64_t from_a, std::vector<int64_t> ids_b,
                  int64_t from_b) {
    std::vector<int64_t> ids, pos, slots;
    for (size_t i = 0; i < ids_a.size(); ++i) {
      ids.push_back(ids_a[i]);
      pos.push_back(from_a + static_cast<int64_t>(i));
      slots.push_back(slot(blocks_a, pos.back()));
    }
    for (size_t i = 0; i < ids_b.size(); ++i) {
      ids.push_back(ids_b[i]);
      pos.push_back(from_b + static_cast<int64_t>(i));
      slots.push_back(slot(blocks_b, pos.back()));
    }
    const auto na = static_cast<int64_t>(ids_a.size()), nb = static_cast<int64_t>(ids_b.size());
    return paged_batch{torch::tensor(ids),
                       torch::tensor(pos),
                       torch::tensor(slots),
                       tables,
                       torch::tensor({from_a + na, from_b + nb}),
                       torch::tensor({int64_t{0}, na, na + nb})};
  };
  auto full = seq;
  m->forward_paged(step({seq.begin(), seq.begin() + 6}, 0, other, 0), cache);
  auto logits = m->forward_paged(step({seq.begin() + 6, seq.end()}, 6, {other.back()}, 5), cache);
  std::vector<float> engine;
  int64_t len_b = 6;
  for (int s = 0; s < 8; ++s) {
    const float* row = logits[0].data_ptr<float>();
    auto stats = kernels::detail::softmax_row(row, 61, 1.0f / 0.7f, nullptr);
    const auto next = (stats.argmax + s * 7) % 61; // any token: its log-prob is what counts
    engine.push_back(
        static_cast<float>(kernels::detail::softmax_row_logprob(stats, row[next], 1.0f / 0.7f)));
    full.push_back(next);
    auto st = step({next}, static_cast<int64_t>(full.size()) - 1,
                   {other[static_cast<size_t>(s % 5)]}, len_b);
    ++len_b;
    if (len_b > 16)
      break;
    logits = m->forward_paged(st, cache);
  }
  auto ids = torch::tensor(full).unsqueeze(0);
  auto lp = batch_invariant_log_probs(*m, ids, torch::ones_like(ids), 0.7, {});
  ASSERT_TRUE(lp);
  for (size_t i = 0; i < engine.size(); ++i)
    EXPECT_EQ(engine[i], (*lp)[0][static_cast<int64_t>(seq.size() - 1 + i)].item<float>())
        << "generated token " << i;
}

TEST(BatchInvariant, RefusesWhatItCannotRun) {
  auto m = model_of();
  m->to(torch::kBFloat16);
  auto ids = torch::tensor(tokens(5, 1)).unsqueeze(0);
  auto lp = batch_invariant_log_probs(*m, ids, torch::ones_like(ids), 1.0, {});
  ASSERT_FALSE(lp);
  EXPECT_NE(describe(lp.error()).find("not fp32"), std::string::npos) << describe(lp.error());
}

// Every output of a linear layer is the same dot product whatever tile
// computes it: a whole batch at once, or one row and one output at a time,
// on each path this CPU runs.
TEST(BatchInvariant, LinearTilesAgreeWithSingleOutputs) {
  std::vector<const kernels::cpu::invariant_kernels*> paths{
      &kernels::cpu::invariant_tables::baseline};
  if (kernels::cpu::cpu_levels::here().x86_64_v3)
    paths.push_back(&kernels::cpu::invariant_tables::avx2);
  const int64_t rows = 9, n = 37, outputs = 10;
  auto x = torch::randn({rows, n}), w = torch::randn({outputs, n}), bias = torch::randn({outputs});
  for (const auto* k : paths) {
    SCOPED_TRACE(k->isa);
    auto all = torch::empty({rows, outputs});
    k->linear(x.data_ptr<float>(), n, rows, n, w.data_ptr<float>(), bias.data_ptr<float>(),
              all.data_ptr<float>(), outputs, 0, outputs);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < outputs; ++o) {
        float one = 0;
        k->linear(x[r].data_ptr<float>(), n, 1, n, w.data_ptr<float>(), bias.data_ptr<float>(),
                  &one - o, outputs, o, o + 1);
        EXPECT_EQ(one, all[r][o].item<float>()) << "row " << r << " output " << o;
      }
    EXPECT_LT((all - torch::addmm(bias, x, w.t())).abs().max().item<double>(), 1e-4);
  }
}
