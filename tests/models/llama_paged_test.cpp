// forward_paged against the dense full-recompute forward: prefill + greedy
// decode, chunked prefill, and requests sharing prompt blocks.

#include "models/llama.hpp"
#include "tests/models/tiny_llama.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

using namespace troupe;
using namespace troupe::models;
using troupe::kernels::cpu::decode_path;
using troupe::kernels::cpu::panels_mode;

namespace {

using troupe::models::testing::tiny_config;

llama_model tiny_paged(head_kind head = head_kind::lm) {
  torch::manual_seed(7);
  auto m = make_llama(tiny_config(), head);
  EXPECT_TRUE(m) << describe(m.error());
  (*m)->eval();
  return *m;
}

std::vector<int64_t> random_tokens(int64_t n, uint64_t seed) {
  std::mt19937_64 rng{seed};
  std::vector<int64_t> out(n);
  for (auto& t : out)
    t = static_cast<int64_t>(rng() % 61);
  return out;
}

/// Dense full-recompute logits [T, V] of one sequence.
torch::Tensor dense_logits(llama_model& model, const std::vector<int64_t>& tokens) {
  torch::NoGradGuard no_grad;
  auto ids = torch::tensor(tokens, torch::kLong).unsqueeze(0);
  return model->forward(ids, torch::ones_like(ids))[0];
}

double max_abs_diff_sized(const torch::Tensor& a, const torch::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return (a - b).abs().max().item<double>();
}

/// A request as the engine would track it: its cached length and block table.
struct request {
  std::vector<int64_t> tokens; // every token whose K/V is (or is being) cached
  int64_t cached = 0;
  std::vector<int32_t> blocks;
};

/// Hands out blocks from a shuffled free list and builds paged steps.
class pager {
public:
  pager(int64_t num_blocks, int64_t block_size, uint64_t seed) : block_size_(block_size) {
    free_.resize(static_cast<size_t>(num_blocks));
    std::iota(free_.begin(), free_.end(), 0);
    std::shuffle(free_.begin(), free_.end(), std::mt19937_64{seed});
  }

  /// One step: request i appends `fresh[i]` (>= 1 tokens) to its cache.
  paged_batch step(const std::vector<request*>& reqs,
                   const std::vector<std::vector<int64_t>>& fresh) {
    std::vector<int64_t> ids, positions, slots, lens, starts{0};
    size_t widest = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      auto& r = *reqs[i];
      for (auto token : fresh[i]) {
        const int64_t pos = r.cached++;
        if (pos / block_size_ >= static_cast<int64_t>(r.blocks.size())) {
          r.blocks.push_back(free_.back());
          free_.pop_back();
        }
        ids.push_back(token);
        positions.push_back(pos);
        slots.push_back(r.blocks[pos / block_size_] * block_size_ + pos % block_size_);
        r.tokens.push_back(token);
      }
      lens.push_back(r.cached);
      starts.push_back(starts.back() + static_cast<int64_t>(fresh[i].size()));
      widest = std::max(widest, r.blocks.size());
    }
    // Unused table entries hold -1: the kernels never read them.
    auto tables = torch::full({static_cast<int64_t>(reqs.size()), static_cast<int64_t>(widest)}, -1,
                              torch::kInt);
    for (size_t i = 0; i < reqs.size(); ++i)
      for (size_t j = 0; j < reqs[i]->blocks.size(); ++j)
        tables.index_put_({static_cast<int64_t>(i), static_cast<int64_t>(j)}, reqs[i]->blocks[j]);
    return {torch::tensor(ids, torch::kLong),   torch::tensor(positions, torch::kLong),
            torch::tensor(slots, torch::kLong), tables,
            torch::tensor(lens, torch::kLong),  torch::tensor(starts, torch::kLong)};
  }

private:
  int64_t block_size_;
  std::vector<int32_t> free_;
};

torch::Tensor all_rows(const paged_batch& b) {
  return torch::arange(b.input_ids.size(0), torch::kLong);
}

int64_t greedy(const torch::Tensor& row) {
  return row.argmax().item<int64_t>();
}

} // namespace

TEST(LlamaPaged, PrefillThenGreedyDecodeMatchesDenseRecompute) {
  auto model = tiny_paged();
  for (int64_t bs : {4, 16}) {
    SCOPED_TRACE("block_size " + std::to_string(bs));
    auto cache = model->make_paged_cache(64, bs);
    pager pages{64, bs, 11};
    request a, b;
    auto pa = random_tokens(7, 1), pb = random_tokens(13, 2);
    // Prefill both prompts in one step; logits for every row.
    auto step = pages.step({&a, &b}, {pa, pb});
    auto logits = model->forward_paged(step, cache, all_rows(step));
    ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{20, 61}));
    EXPECT_FALSE(logits.requires_grad());
    EXPECT_LT(max_abs_diff_sized(logits.narrow(0, 0, 7), dense_logits(model, pa)), 1e-5);
    EXPECT_LT(max_abs_diff_sized(logits.narrow(0, 7, 13), dense_logits(model, pb)), 1e-5);
    int64_t next_a = greedy(logits[6]), next_b = greedy(logits[19]);
    for (int s = 0; s < 8; ++s) {
      step = pages.step({&a, &b}, {{next_a}, {next_b}});
      logits = model->forward_paged(step, cache); // default rows: each request's last token
      ASSERT_EQ(logits.sizes(), (std::vector<int64_t>{2, 61}));
      auto want_a = dense_logits(model, a.tokens), want_b = dense_logits(model, b.tokens);
      EXPECT_LT(max_abs_diff_sized(logits[0], want_a[-1]), 1e-5) << "decode step " << s;
      EXPECT_LT(max_abs_diff_sized(logits[1], want_b[-1]), 1e-5) << "decode step " << s;
      next_a = greedy(logits[0]);
      next_b = greedy(logits[1]);
    }
    EXPECT_EQ(a.tokens.size(), 15u);
    EXPECT_EQ(b.tokens.size(), 21u);
  }
}

TEST(LlamaPaged, ChunkedPrefillMatchesOneShot) {
  auto model = tiny_paged();
  auto prompt = random_tokens(11, 3);
  // One shot, in its own cache.
  auto one_cache = model->make_paged_cache(16, 4);
  pager one_pages{16, 4, 5};
  request alone;
  auto one_step = one_pages.step({&alone}, {prompt});
  auto want = model->forward_paged(one_step, one_cache, all_rows(one_step));
  // Three chunks (4, 3, 4) across steps, next to another request that
  // prefills in the first step and decodes in the others.
  auto cache = model->make_paged_cache(32, 4);
  pager pages{32, 4, 6};
  request a, other;
  auto po = random_tokens(6, 4);
  std::vector<torch::Tensor> chunks;
  auto step = pages.step({&other, &a}, {po, {prompt.begin(), prompt.begin() + 4}});
  auto logits = model->forward_paged(step, cache, all_rows(step));
  chunks.push_back(logits.narrow(0, 6, 4));
  EXPECT_LT(max_abs_diff_sized(logits.narrow(0, 0, 6), dense_logits(model, po)), 1e-5);
  step = pages.step({&a, &other}, {{prompt.begin() + 4, prompt.begin() + 7}, {greedy(logits[5])}});
  logits = model->forward_paged(step, cache, all_rows(step));
  chunks.push_back(logits.narrow(0, 0, 3));
  step = pages.step({&other, &a}, {{greedy(logits[3])}, {prompt.begin() + 7, prompt.end()}});
  logits = model->forward_paged(step, cache, all_rows(step));
  chunks.push_back(logits.narrow(0, 1, 4));
  EXPECT_LT(max_abs_diff_sized(logits[0], dense_logits(model, other.tokens)[-1]), 1e-5);
  auto chunked = torch::cat(chunks);
  EXPECT_LT(max_abs_diff_sized(chunked, want), 1e-5);
  EXPECT_LT(max_abs_diff_sized(chunked, dense_logits(model, prompt)), 1e-5);
}

TEST(LlamaPaged, RequestsSharingPromptBlocksMatchComputingAlone) {
  auto model = tiny_paged();
  const int64_t bs = 4;
  auto shared = random_tokens(8, 5); // two full blocks
  auto suffix_a = random_tokens(3, 6), suffix_b = random_tokens(5, 7);
  auto cache = model->make_paged_cache(32, bs);
  pager pages{32, bs, 8};
  request a;
  auto prompt_a = shared;
  prompt_a.insert(prompt_a.end(), suffix_a.begin(), suffix_a.end());
  auto step = pages.step({&a}, {prompt_a});
  model->forward_paged(step, cache);
  // b reuses a's two full prompt blocks (prefix sharing) and computes only its suffix.
  request b;
  b.tokens = shared;
  b.cached = 8;
  b.blocks = {a.blocks[0], a.blocks[1]};
  step = pages.step({&b}, {suffix_b});
  auto logits_b = model->forward_paged(step, cache, all_rows(step));
  // b computed alone, from scratch, in its own cache.
  auto alone_cache = model->make_paged_cache(32, bs);
  pager alone_pages{32, bs, 9};
  request alone;
  auto step_alone = alone_pages.step({&alone}, {b.tokens});
  auto want = model->forward_paged(step_alone, alone_cache, torch::arange(8, 13, torch::kLong));
  EXPECT_LT(max_abs_diff_sized(logits_b, want), 1e-5);
  EXPECT_LT(max_abs_diff_sized(logits_b, dense_logits(model, b.tokens).narrow(0, 8, 5)), 1e-5);
  // Both decode together; a's blocks were not disturbed by b.
  int64_t next_a = greedy(dense_logits(model, a.tokens)[-1]), next_b = greedy(logits_b[-1]);
  for (int s = 0; s < 3; ++s) {
    step = pages.step({&a, &b}, {{next_a}, {next_b}});
    auto logits = model->forward_paged(step, cache);
    EXPECT_LT(max_abs_diff_sized(logits[0], dense_logits(model, a.tokens)[-1]), 1e-5);
    EXPECT_LT(max_abs_diff_sized(logits[1], dense_logits(model, b.tokens)[-1]), 1e-5);
    next_a = greedy(logits[0]);
    next_b = greedy(logits[1]);
  }
}

TEST(LlamaPaged, RunForwardPagedReturnsErrorsWithTheirCodes) {
  auto model = tiny_paged();
  auto cache = model->make_paged_cache(8, 4);
  pager pages{8, 4, 10};
  request a;
  auto good = pages.step({&a}, {random_tokens(6, 11)});
  auto ok = run_forward_paged(model, good, cache);
  ASSERT_TRUE(ok) << describe(ok.error());
  EXPECT_EQ(ok->sizes(), (std::vector<int64_t>{1, 61}));

  auto bad = good;
  bad.query_start = torch::tensor({0, 5}, torch::kLong);
  auto r = run_forward_paged(model, bad, cache);
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::shape_mismatch);
  EXPECT_NE(context_of(r.error()).find("query_start[1] = 5, but q has 6 token rows"),
            std::string::npos)
      << describe(r.error());

  bad = good;
  bad.block_tables = good.block_tables.narrow(1, 0, 1);
  r = run_forward_paged(model, bad, cache);
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::out_of_range) << describe(r.error());

  bad = good;
  bad.slot_mapping = good.slot_mapping.clone();
  bad.slot_mapping[0] = 32;
  r = run_forward_paged(model, bad, cache);
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::out_of_range) << describe(r.error());

  bad = good;
  bad.positions = good.positions.narrow(0, 0, 5);
  r = run_forward_paged(model, bad, cache);
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::shape_mismatch) << describe(r.error());

  r = run_forward_paged(model, good, cache, torch::tensor({6}, torch::kLong));
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::out_of_range) << describe(r.error());

  auto small = model->make_paged_cache(8, 2);
  small.block_size = 4; // disagrees with the pools
  r = run_forward_paged(model, good, small);
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::shape_mismatch) << describe(r.error());

  auto critic = tiny_paged(head_kind::value);
  auto critic_cache = critic->make_paged_cache(8, 4);
  r = run_forward_paged(critic, good, critic_cache);
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::unsupported) << describe(r.error());
  // The member throws a c10::Error (TORCH_CHECK style).
  EXPECT_THROW(critic->forward_paged(good, critic_cache), c10::Error);
}

// NOTE [fused decode]: decode steps (one new token per request) run the
// fused CPU kernel; they must agree with the ATen path (the same model,
// fusing off) and with dense recompute, and write the same K/V, with 1 and
// 2 threads, one request or five of different lengths, for GQA, biases and
// a tied head. The prompts' step runs with fusing on too (the ATen path
// takes it) and must leave the same caches.
TEST(LlamaPaged, FusedDecodeStepsMatchTheAtenPathAndRecompute) {
  const int threads_before = at::get_num_threads();
  for (int variant = 0; variant < 3; ++variant) {
    auto config = tiny_config();
    if (variant >= 1) {
      config.qkv_bias = true;
      config.o_bias = true;
      config.mlp_bias = true;
    }
    if (variant == 2) {
      config.tie_word_embeddings = true;
      config.num_key_value_heads = 1;
    }
    torch::manual_seed(13 + variant);
    auto m = make_llama(config, head_kind::lm);
    ASSERT_TRUE(m) << describe(m.error());
    auto model = *m;
    model->eval();
    {
      torch::NoGradGuard no_grad; // non-zero biases, so that they count
      for (auto& [name, t] : model->named_weights())
        if (name.find("bias") != std::string::npos)
          t.normal_(0, 0.1);
    }
    for (auto isa : kernels::cpu::supported_decode_isas())
      for (bool panels : {false, true})
        for (int threads : {1, 2})
          for (size_t batch : {1, 5}) {
            SCOPED_TRACE("variant " + std::to_string(variant) + ", " + std::string{to_string(isa)} +
                         ", threads " + std::to_string(threads) + ", batch " +
                         std::to_string(batch) + (panels ? ", panels" : ""));
            at::set_num_threads(threads);
            model->set_decode_isa(isa);
            model->set_decode_panels(panels ? panels_mode::on : panels_mode::off);
            auto fused_cache = model->make_paged_cache(48, 4);
            auto aten_cache = model->make_paged_cache(48, 4);
            pager fused_pages{48, 4, 5}, aten_pages{48, 4, 5};
            std::vector<request> fr(batch), ar(batch);
            std::vector<request*> fp, ap;
            std::vector<std::vector<int64_t>> prompts;
            for (size_t r = 0; r < batch; ++r) {
              fp.push_back(&fr[r]);
              ap.push_back(&ar[r]);
              prompts.push_back(random_tokens(static_cast<int64_t>(3 + 4 * r), 3 + r));
            }
            model->set_decode_path(decode_path::fused); // the prompts: the ATen path either way
            model->forward_paged(fused_pages.step(fp, prompts), fused_cache);
            model->forward_paged(aten_pages.step(ap, prompts), aten_cache);
            std::vector<std::vector<int64_t>> next(batch, std::vector<int64_t>{5});
            for (int s = 0; s < 8; ++s) {
              model->set_decode_path(decode_path::fused);
              auto fused = model->forward_paged(fused_pages.step(fp, next), fused_cache);
              model->set_decode_path(decode_path::aten);
              auto aten = model->forward_paged(aten_pages.step(ap, next), aten_cache);
              ASSERT_EQ(fused.sizes(), aten.sizes());
              EXPECT_LT(max_abs_diff_sized(fused, aten), 1e-5) << "step " << s;
              for (size_t r = 0; r < batch; ++r) {
                auto row = static_cast<int64_t>(r);
                EXPECT_LT(max_abs_diff_sized(fused[row], dense_logits(model, fr[r].tokens)[-1]),
                          1e-5)
                    << "step " << s << ", request " << r;
                next[r] = {greedy(fused[row])};
              }
              for (size_t l = 0; l < fused_cache.k.size(); ++l) {
                EXPECT_LT(max_abs_diff_sized(fused_cache.k[l], aten_cache.k[l]), 1e-5);
                EXPECT_LT(max_abs_diff_sized(fused_cache.v[l], aten_cache.v[l]), 1e-5);
              }
            }
            // Batches made the packed copy when asked to, and only then.
            if (batch > 1) {
              EXPECT_EQ(model->decode_panels_bytes(),
                        panels ? decode_panels_bytes(config, isa) : 0);
            }
          }
    model->set_decode_panels(panels_mode::off);
    EXPECT_EQ(model->decode_panels_bytes(), 0);
  }
  at::set_num_threads(threads_before);
}

// NOTE [mixed steps]: a step of decode rows amid a new turn's prefill, a
// chunk without logits and a new request runs its decode rows through the
// fused kernel (and says so) and its prefill rows through ATen: the logits
// and the cache equal the ATen path's and a dense recompute.
TEST(LlamaPaged, AMixedStepRunsItsDecodeRowsFusedAndTheRestThroughAten) {
  auto model = tiny_paged();
  auto fused_cache = model->make_paged_cache(64, 4), aten_cache = model->make_paged_cache(64, 4);
  pager fused_pages{64, 4, 9}, aten_pages{64, 4, 9};
  std::vector<request> fr(5), ar(5);
  auto run = [&](decode_path path, const std::vector<size_t>& which,
                 const std::vector<std::vector<int64_t>>& fresh, const torch::Tensor& rows) {
    auto& reqs = path == decode_path::fused ? fr : ar;
    auto& pages = path == decode_path::fused ? fused_pages : aten_pages;
    std::vector<request*> ptrs;
    for (auto i : which)
      ptrs.push_back(&reqs[i]);
    model->set_decode_path(path);
    return model->forward_paged(pages.step(ptrs, fresh),
                                path == decode_path::fused ? fused_cache : aten_cache, rows);
  };
  std::vector<std::vector<int64_t>> prompts;
  for (uint64_t r = 0; r < 4; ++r)
    prompts.push_back(random_tokens(static_cast<int64_t>(5 + 3 * r), 60 + r));
  for (auto path : {decode_path::fused, decode_path::aten})
    run(path, {0, 1, 2, 3}, prompts, torch::Tensor{});
  EXPECT_FALSE(model->last_decode().decode) << "prompts alone: no decode rows";
  // Requests 0 and 2 decode; 1 takes a 3-token turn; 3 a 2-token chunk
  // whose logits nobody asks for; 4 is new.
  const std::vector<size_t> which{0, 1, 2, 3, 4};
  const std::vector<std::vector<int64_t>> fresh{
      {7}, {8, 9, 10}, {11}, {12, 13}, random_tokens(6, 70)};
  // Token rows: 0 | 1 2 3 | 4 | 5 6 | 7..12.
  const auto rows = torch::tensor(std::vector<int64_t>{0, 3, 4, 12}, torch::kLong);
  auto fused = run(decode_path::fused, which, fresh, rows);
  auto report = model->last_decode();
  EXPECT_TRUE(report.decode);
  EXPECT_TRUE(report.fused) << report.why;
  auto aten = run(decode_path::aten, which, fresh, rows);
  EXPECT_TRUE(model->last_decode().decode);
  EXPECT_FALSE(model->last_decode().fused);
  ASSERT_EQ(fused.sizes(), aten.sizes());
  EXPECT_LT(max_abs_diff_sized(fused, aten), 1e-5);
  const std::vector<size_t> owners{0, 1, 2, 4};
  for (size_t k = 0; k < owners.size(); ++k)
    EXPECT_LT(max_abs_diff_sized(fused[static_cast<int64_t>(k)],
                                 dense_logits(model, fr[owners[k]].tokens)[-1]),
              1e-5)
        << "logit row " << k;
  // Next: everyone's last token asked for (no logit rows given).
  const std::vector<std::vector<int64_t>> more{{1}, {2}, {3, 4}, {5}, {6}};
  fused = run(decode_path::fused, which, more, torch::Tensor{});
  EXPECT_TRUE(model->last_decode().fused);
  aten = run(decode_path::aten, which, more, torch::Tensor{});
  ASSERT_EQ(fused.size(0), 5);
  EXPECT_LT(max_abs_diff_sized(fused, aten), 1e-5);
  for (size_t r = 0; r < 5; ++r)
    EXPECT_LT(
        max_abs_diff_sized(fused[static_cast<int64_t>(r)], dense_logits(model, fr[r].tokens)[-1]),
        1e-5)
        << "request " << r;
  for (size_t l = 0; l < fused_cache.k.size(); ++l) {
    EXPECT_LT(max_abs_diff_sized(fused_cache.k[l], aten_cache.k[l]), 1e-5);
    EXPECT_LT(max_abs_diff_sized(fused_cache.v[l], aten_cache.v[l]), 1e-5);
  }
  model->set_decode_path(decode_path::automatic);
}

// One batched decode step's logits through the fused kernel and through
// the ATen path, from the same cache contents.
std::pair<torch::Tensor, torch::Tensor> fused_and_aten_step(llama_model& model, int64_t batch) {
  auto fused_cache = model->make_paged_cache(4 * batch, 4);
  auto aten_cache = model->make_paged_cache(4 * batch, 4);
  pager fused_pages{4 * batch, 4, 7}, aten_pages{4 * batch, 4, 7};
  std::vector<request> fr(static_cast<size_t>(batch)), ar(static_cast<size_t>(batch));
  std::vector<request*> fp, ap;
  std::vector<std::vector<int64_t>> prompts, next;
  for (int64_t r = 0; r < batch; ++r) {
    fp.push_back(&fr[static_cast<size_t>(r)]);
    ap.push_back(&ar[static_cast<size_t>(r)]);
    prompts.push_back(random_tokens(3 + r, static_cast<uint64_t>(40 + r)));
    next.push_back({7 + r});
  }
  model->forward_paged(fused_pages.step(fp, prompts), fused_cache);
  model->forward_paged(aten_pages.step(ap, prompts), aten_cache);
  model->set_decode_path(decode_path::fused);
  auto fused = model->forward_paged(fused_pages.step(fp, next), fused_cache);
  model->set_decode_path(decode_path::aten);
  auto aten = model->forward_paged(aten_pages.step(ap, next), aten_cache);
  model->set_decode_path(decode_path::automatic);
  return {fused, aten};
}

// The packed copy follows the weights: after an in-place write (as an
// optimizer step does) and after assign_hf_weights (as an engine's weight
// load does), a batched step reads the new weights, not the packed old ones.
TEST(LlamaPaged, DecodePanelsFollowWeightChanges) {
  torch::manual_seed(21);
  auto m = make_llama(tiny_config(), head_kind::lm);
  ASSERT_TRUE(m) << describe(m.error());
  auto model = *m;
  model->eval();
  model->set_decode_panels(panels_mode::on);
  auto [before, before_aten] = fused_and_aten_step(model, 3);
  EXPECT_LT(max_abs_diff_sized(before, before_aten), 1e-5);
  ASSERT_GT(model->decode_panels_bytes(), 0);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters())
      p.mul_(1.5);
  }
  auto [scaled, scaled_aten] = fused_and_aten_step(model, 3);
  EXPECT_GT(max_abs_diff_sized(scaled, before), 1e-3); // the weights did change
  EXPECT_LT(max_abs_diff_sized(scaled, scaled_aten), 1e-5);

  torch::manual_seed(22);
  auto other = make_llama(tiny_config(), head_kind::lm);
  ASSERT_TRUE(other);
  ASSERT_TRUE(assign_hf_weights(model, export_hf_weights(*other)));
  auto [loaded, loaded_aten] = fused_and_aten_step(model, 3);
  EXPECT_GT(max_abs_diff_sized(loaded, scaled), 1e-3);
  EXPECT_LT(max_abs_diff_sized(loaded, loaded_aten), 1e-5);
}

// The fused kernel reads raw fp32 rows: a weight it cannot read so (here a
// transposed layout of the same values, as a strided load leaves it) sends
// the step to the ATen path, at batch 1 (stored rows) and batched (panels).
TEST(LlamaPaged, AWeightTheFusedKernelCannotReadSendsTheStepToAten) {
  torch::manual_seed(23);
  auto m = make_llama(tiny_config(), head_kind::lm);
  ASSERT_TRUE(m) << describe(m.error());
  auto model = *m;
  model->eval();
  auto [batch_one, batch_one_aten] = fused_and_aten_step(model, 1);
  auto [batched, batched_aten] = fused_and_aten_step(model, 3);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->named_parameters())
      if (p.key().find("wo.weight") != std::string::npos ||
          p.key().find("w1.weight") != std::string::npos)
        p.value().set_data(p.value().t().contiguous().t());
  }
  ASSERT_FALSE(model->named_parameters()["layers.0.attention.wo.weight"].is_contiguous());
  model->set_decode_panels(panels_mode::on);
  auto [strided_one, strided_one_aten] = fused_and_aten_step(model, 1);
  auto [strided, strided_aten] = fused_and_aten_step(model, 3);
  EXPECT_LT(max_abs_diff_sized(strided_one, batch_one_aten), 1e-5);
  EXPECT_LT(max_abs_diff_sized(strided, batched_aten), 1e-5);
  EXPECT_LT(max_abs_diff_sized(strided_one_aten, batch_one_aten), 1e-5);
}
