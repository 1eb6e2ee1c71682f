// The fused CPU decode's pieces (kernels/cpu/fused_decode.hpp): the dot
// product against a double-precision sum, the thread team's runs and
// barriers, and one whole step against a plain per-op reference written in
// LibTorch (the model-level comparison with the ATen path is in
// tests/models/llama_paged_test.cpp).
#include "kernels/cpu/fused_decode.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <omp.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

namespace cpu = troupe::kernels::cpu;

namespace {

TEST(FusedDecode, DotMatchesADoubleSumForEveryTailLength) {
  torch::manual_seed(3);
  for (auto isa : cpu::supported_decode_isas())
    for (int64_t n :
         {0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 127, 288, 768, 1001}) {
      auto a = torch::randn({n + 1}), b = torch::randn({n + 1});
      // Offset by one float: the kernel must not assume aligned rows.
      const float* pa = a.data_ptr<float>() + 1;
      const float* pb = b.data_ptr<float>() + 1;
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) {
        ref += static_cast<double>(pa[i]) * pb[i];
        mag += std::abs(static_cast<double>(pa[i]) * pb[i]);
      }
      EXPECT_NEAR(cpu::dot(pa, pb, n, isa), ref, 1e-6 * (mag + 1)) << to_string(isa) << ", n " << n;
    }
}

TEST(FusedDecode, TeamRunsEveryMemberAndBarriersOrderThePhases) {
  for (int size : {1, 2, 3, 4}) {
    cpu::thread_team team{size};
    ASSERT_EQ(team.size(), size);
    // Each phase every member writes its own slot, then after the barrier
    // every member reads all slots of that phase: a barrier that let one
    // member through early would show a stale value.
    constexpr int kPhases = 200;
    std::vector<std::atomic<int>> slot(static_cast<size_t>(size));
    std::atomic<int> wrong{0}, calls{0};
    for (int run = 0; run < 20; ++run) {
      team.run([&](int member, int members) {
        EXPECT_EQ(members, size); // not nested: every member asked for
        calls.fetch_add(1);
        for (int p = 0; p < kPhases; ++p) {
          slot[static_cast<size_t>(member)].store(run * kPhases + p);
          team.barrier();
          for (int other = 0; other < size; ++other)
            if (slot[static_cast<size_t>(other)].load() != run * kPhases + p)
              wrong.fetch_add(1);
          team.barrier();
        }
      });
    }
    EXPECT_EQ(calls.load(), 20 * size) << "size " << size;
    EXPECT_EQ(wrong.load(), 0) << "size " << size;
  }
}

// NOTE [decode team]: a step run from inside another parallel region gets
// the members OpenMP gives it there (one), and still computes the whole
// step: the work is split by the count given, not the count asked for.
TEST(FusedDecode, ANestedRunGetsOneMemberAndDoesAllTheWork) {
  cpu::thread_team team{2};
  std::vector<int> members_seen(2, -1), done(2, 0);
#pragma omp parallel num_threads(2)
  {
    const int outer = omp_get_thread_num();
    team.run([&](int member, int members) {
      members_seen[static_cast<size_t>(outer)] = members;
      done[static_cast<size_t>(outer)] += member == 0;
    });
  }
  EXPECT_EQ(members_seen, (std::vector<int>{1, 1}));
  EXPECT_EQ(done, (std::vector<int>{1, 1}));
}

// A two-layer GQA decoder with biases, written op by op in LibTorch.
struct reference_model {
  int64_t dim = 32, hidden = 48, n_heads = 4, n_kv = 2, head_dim = 8,
          vocab = 600; // more rows than a block of the alternating head order
  int64_t block_size = 4, num_blocks = 32;
  float eps = 1e-5f;
  struct layer {
    torch::Tensor attn_norm, wq, wk, wv, wo, bq, bk, bv, bo, ffn_norm, w1, w3, w2, b1, b3, b2;
    torch::Tensor k_cache, v_cache;
  };
  std::vector<layer> layers;
  torch::Tensor inv_freq, final_norm, lm_head, embedding;

  explicit reference_model(int64_t head_dim_ = 8) : head_dim(head_dim_) {
    torch::manual_seed(11);
    auto r = [](std::initializer_list<int64_t> s) { return torch::randn(s) * 0.2; };
    for (int i = 0; i < 2; ++i)
      layers.push_back({1 + r({dim}), r({n_heads * head_dim, dim}), r({n_kv * head_dim, dim}),
                        r({n_kv * head_dim, dim}), r({dim, n_heads * head_dim}),
                        r({n_heads * head_dim}), r({n_kv * head_dim}), r({n_kv * head_dim}),
                        r({dim}), 1 + r({dim}), r({hidden, dim}), r({hidden, dim}),
                        r({dim, hidden}), r({hidden}), r({hidden}), r({dim}),
                        r({num_blocks, block_size, n_kv, head_dim}),
                        r({num_blocks, block_size, n_kv, head_dim})});
    inv_freq = torch::pow(10000.0, -torch::arange(0, head_dim, 2, torch::kFloat64) / head_dim)
                   .to(torch::kFloat32);
    final_norm = 1 + r({dim});
    lm_head = r({vocab, dim});
    embedding = r({vocab, dim});
  }

  torch::Tensor norm(const torch::Tensor& x, const torch::Tensor& w) const {
    return w * (x * torch::rsqrt(x.pow(2).mean(-1, true) + eps));
  }
  torch::Tensor rope(const torch::Tensor& v, int64_t pos) const { // [H, D]
    auto angle = static_cast<float>(pos) * inv_freq;
    auto c = torch::cat({angle.cos(), angle.cos()}), s = torch::cat({angle.sin(), angle.sin()});
    auto half = head_dim / 2;
    auto rot = torch::cat({-v.narrow(1, half, half), v.narrow(1, 0, half)}, 1);
    return v * c + rot * s;
  }

  // Logits of `token` at `pos`; writes its K/V at `slot`; attends over
  // `table`'s first pos + 1 positions (the caches' other rows are filler).
  torch::Tensor step(int64_t token, int64_t pos, int64_t slot, const std::vector<int32_t>& table) {
    auto x = embedding[token].clone();
    for (auto& L : layers) {
      auto xn = norm(x, L.attn_norm);
      auto q = rope((torch::mv(L.wq, xn) + L.bq).view({n_heads, head_dim}), pos);
      auto k = rope((torch::mv(L.wk, xn) + L.bk).view({n_kv, head_dim}), pos);
      auto v = (torch::mv(L.wv, xn) + L.bv).view({n_kv, head_dim});
      L.k_cache.view({-1, n_kv, head_dim})[slot].copy_(k);
      L.v_cache.view({-1, n_kv, head_dim})[slot].copy_(v);
      std::vector<int64_t> rows;
      for (int64_t p = 0; p <= pos; ++p)
        rows.push_back(table[static_cast<size_t>(p / block_size)] * block_size + p % block_size);
      auto idx = torch::tensor(rows);
      auto K = L.k_cache.view({-1, n_kv, head_dim}).index_select(0, idx); // [T, KV, D]
      auto V = L.v_cache.view({-1, n_kv, head_dim}).index_select(0, idx);
      std::vector<torch::Tensor> heads;
      for (int64_t h = 0; h < n_heads; ++h) {
        auto kv = h / (n_heads / n_kv);
        auto w = torch::softmax(torch::mv(K.select(1, kv), q[h]) / std::sqrt(float(head_dim)), 0);
        heads.push_back(torch::mv(V.select(1, kv).t(), w));
      }
      x = x + torch::mv(L.wo, torch::cat(heads)) + L.bo;
      auto hn = norm(x, L.ffn_norm);
      auto g = torch::mv(L.w1, hn) + L.b1;
      x = x + torch::mv(L.w2, torch::silu(g) * (torch::mv(L.w3, hn) + L.b3)) + L.b2;
    }
    return torch::mv(lm_head, norm(x, final_norm));
  }

  cpu::decode_model view() {
    cpu::decode_model m;
    m.dim = dim, m.hidden = hidden, m.n_heads = n_heads, m.n_kv = n_kv, m.head_dim = head_dim;
    m.vocab = vocab, m.eps = eps, m.block_size = block_size;
    m.inv_freq = inv_freq.data_ptr<float>();
    for (auto& L : layers) {
      auto p = [](const torch::Tensor& t) { return t.data_ptr<float>(); };
      m.layers.push_back({p(L.attn_norm), p(L.wq), p(L.wk), p(L.wv), p(L.wo), p(L.bq), p(L.bk),
                          p(L.bv), p(L.bo), p(L.ffn_norm), p(L.w1), p(L.w3), p(L.w2), p(L.b1),
                          p(L.b3), p(L.b2), p(L.k_cache), p(L.v_cache)});
    }
    m.final_norm = final_norm.data_ptr<float>();
    m.lm_head = lm_head.data_ptr<float>();
    m.embedding = embedding.data_ptr<float>();
    return m;
  }

  // view() with every matrix also in panels for the path (kept in `panels`).
  cpu::decode_model packed_view(cpu::decode_isa isa) {
    auto m = view();
    m.isa = isa;
    const auto rows = cpu::panel_rows(isa);
    auto pack = [&](const torch::Tensor& w) {
      auto c = w.contiguous();
      panels.push_back(torch::empty({cpu::packed_size(c.size(0), c.size(1), rows)}));
      cpu::pack_panels(c.data_ptr<float>(), c.size(0), c.size(1), rows,
                       panels.back().data_ptr<float>());
      return panels.back().data_ptr<float>();
    };
    for (size_t i = 0; i < layers.size(); ++i) {
      auto& L = layers[i];
      auto& P = m.layers[i].panels;
      P.qkv = pack(torch::cat({L.wq, L.wk, L.wv}));
      P.wo = pack(L.wo);
      panels.push_back(torch::empty({cpu::packed_size(2 * hidden, dim, rows)}));
      cpu::pack_swiglu(L.w1.data_ptr<float>(), L.w3.data_ptr<float>(), hidden, dim, rows,
                       panels.back().data_ptr<float>());
      P.w13 = panels.back().data_ptr<float>();
      P.w2 = pack(L.w2);
    }
    m.lm_head_panels = pack(lm_head);
    return m;
  }
  std::vector<torch::Tensor> panels;
};

TEST(FusedDecode, PanelsHoldEachRowsKthElementsTogetherAndPadWithZeros) {
  for (int64_t P : {8, 16, 32}) { // every path's panel
    SCOPED_TRACE("panel rows " + std::to_string(P));
    const int64_t rows = P + P / 4, cols = 3; // a whole panel and a padded one
    auto w = torch::randn({rows, cols});
    std::vector<float> out(static_cast<size_t>(cpu::packed_size(rows, cols, P)), -1.0f);
    ASSERT_EQ(out.size(), static_cast<size_t>(2 * P * cols));
    cpu::pack_panels(w.data_ptr<float>(), rows, cols, P, out.data());
    auto a = w.accessor<float, 2>();
    for (int64_t p = 0; p < 2; ++p)
      for (int64_t k = 0; k < cols; ++k)
        for (int64_t j = 0; j < P; ++j) {
          auto r = p * P + j;
          EXPECT_EQ(out[static_cast<size_t>((p * cols + k) * P + j)], r < rows ? a[r][k] : 0.0f)
              << "panel " << p << ", k " << k << ", row " << j;
        }
    // SwiGLU: P / 2 rows of w1 then the same rows of w3 in each panel.
    const int64_t hidden = P / 2 + P / 8, half = P / 2;
    auto w1 = torch::randn({hidden, cols}), w3 = torch::randn({hidden, cols});
    std::vector<float> sw(static_cast<size_t>(cpu::packed_size(2 * hidden, cols, P)), -1.0f);
    cpu::pack_swiglu(w1.data_ptr<float>(), w3.data_ptr<float>(), hidden, cols, P, sw.data());
    auto a1 = w1.accessor<float, 2>(), a3 = w3.accessor<float, 2>();
    for (int64_t p = 0; p < 2; ++p)
      for (int64_t k = 0; k < cols; ++k)
        for (int64_t j = 0; j < P; ++j) {
          auto r = p * half + j % half;
          float want = r >= hidden ? 0.0f : j < half ? a1[r][k] : a3[r][k];
          EXPECT_EQ(sw[static_cast<size_t>((p * cols + k) * P + j)], want)
              << "panel " << p << ", k " << k << ", row " << j;
        }
  }
}

// Requests of different lengths decoded together: each request's tokens
// and block table are its own; every step's logits and K/V must equal the
// per-op reference's, for batches that fill whole tiles and leave
// remainders, from the stored rows and from the panels (whose tiles hold up
// to 12 or 6 tokens: 13 takes two or three), on every path this CPU runs;
// heads of 8 (attention's scalar loops on the wider paths) and of 32 (its
// vector ones).
TEST(FusedDecode, BatchedStepsMatchAPerOpReferenceAndWriteTheSameKv) {
  for (auto isa : cpu::supported_decode_isas())
    for (int64_t head_dim : {8, 32})
      for (bool panels : {false, true})
        for (int threads : {1, 2, 3})
          for (int64_t batch : {1, 3, 5, 13}) {
            SCOPED_TRACE(std::string{to_string(isa)} + ", head_dim " + std::to_string(head_dim) +
                         ", threads " + std::to_string(threads) + ", batch " +
                         std::to_string(batch) + (panels ? ", panels" : ", stored rows"));
            reference_model ref{head_dim}, fused{head_dim};
            for (size_t l = 0; l < ref.layers.size(); ++l) { // the same caches to start with
              fused.layers[l].k_cache.copy_(ref.layers[l].k_cache);
              fused.layers[l].v_cache.copy_(ref.layers[l].v_cache);
            }
            auto m = panels ? fused.packed_view(isa) : fused.view();
            m.isa = isa;
            cpu::thread_team team{threads};
            // Request r owns blocks 2r + 1 and 2r, in that order (out of order,
            // so that the tables' indirection counts); request r starts r % 2
            // positions in and crosses into its second block.
            const int64_t width = 2;
            std::vector<int32_t> tables;
            for (int64_t r = 0; r < batch; ++r)
              tables.insert(tables.end(),
                            {static_cast<int32_t>(2 * r + 1), static_cast<int32_t>(2 * r)});
            std::vector<float> logits(static_cast<size_t>(batch * fused.vocab));
            for (int64_t step = 0; step < 6; ++step) {
              std::vector<int64_t> tokens, pos, slots, ctx;
              for (int64_t r = 0; r < batch; ++r) {
                auto p = r % 2 + step;
                const int32_t* table = tables.data() + r * width;
                tokens.push_back((p * 7 + 3 + r * 11) % fused.vocab);
                pos.push_back(p);
                slots.push_back(table[p / 4] * 4 + p % 4);
                ctx.push_back(p + 1);
              }
              cpu::decode_batch b;
              b.size = batch;
              b.tokens = tokens.data();
              b.positions = pos.data();
              b.slots = slots.data();
              b.block_tables = tables.data();
              b.table_width = width;
              b.context_lens = ctx.data();
              b.logits = logits.data();
              b.reverse_head = step % 2 == 1; // NOTE [alternating head order]
              cpu::fused_decode(m, b, team);
              for (int64_t r = 0; r < batch; ++r) {
                std::vector<int32_t> table(tables.begin() + r * width,
                                           tables.begin() + (r + 1) * width);
                auto want = ref.step(tokens[r], pos[r], slots[r], table);
                auto got = torch::from_blob(logits.data() + r * fused.vocab, {fused.vocab});
                EXPECT_LT((got - want).abs().max().item<float>(), 2e-5)
                    << "step " << step << ", request " << r;
              }
              for (size_t l = 0; l < ref.layers.size(); ++l) {
                EXPECT_LT(
                    (fused.layers[l].k_cache - ref.layers[l].k_cache).abs().max().item<float>(),
                    1e-5);
                EXPECT_LT(
                    (fused.layers[l].v_cache - ref.layers[l].v_cache).abs().max().item<float>(),
                    1e-5);
              }
            }
          }
}

// A NaN in one cached key reaches the logits whichever part of the
// request's positions holds it (NOTE [attention parts]: one request on 2 or
// 3 members is cut into as many parts, and the combination must not lose
// a part's NaN), as the per-op reference's softmax does; a long context
// (40 positions, 10 blocks) puts it in the first, a middle and the last part.
TEST(FusedDecode, ANaNKeyInAnyAttentionPartMakesTheLogitsNaN) {
  for (auto isa : cpu::supported_decode_isas())
    for (int threads : {1, 2, 3})
      for (int64_t nan_at : {0, 20, 38}) {
        SCOPED_TRACE(std::string{to_string(isa)} + ", threads " + std::to_string(threads) +
                     ", NaN key at position " + std::to_string(nan_at));
        reference_model fused{32};
        auto m = fused.view();
        m.isa = isa;
        std::vector<int32_t> table(10);
        for (int32_t i = 0; i < 10; ++i)
          table[static_cast<size_t>(i)] = 9 - i; // out of order
        const int64_t pos = 39, slot = table[pos / 4] * 4 + pos % 4;
        auto k0 = fused.layers[0].k_cache.view({-1, fused.n_kv, fused.head_dim});
        k0[table[static_cast<size_t>(nan_at / 4)] * 4 + nan_at % 4][1][3] =
            std::numeric_limits<float>::quiet_NaN();
        std::vector<int64_t> token{5}, position{pos}, slots{slot}, ctx{pos + 1};
        std::vector<float> logits(static_cast<size_t>(fused.vocab));
        cpu::decode_batch b;
        b.size = 1;
        b.tokens = token.data();
        b.positions = position.data();
        b.slots = slots.data();
        b.block_tables = table.data();
        b.table_width = 10;
        b.context_lens = ctx.data();
        b.logits = logits.data();
        cpu::thread_team team{threads};
        cpu::fused_decode(m, b, team);
        for (float v : logits)
          ASSERT_TRUE(std::isnan(v));
      }
}

} // namespace
