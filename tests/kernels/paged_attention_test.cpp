#include "kernels/paged_attention.hpp"

#include "tests/kernels/test_util.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <string>
#include <vector>

using namespace troupe;
using namespace troupe::kernels;
using namespace troupe::kernels::testing;

namespace {

/// One request of a step: `context` tokens in the cache, the last `fresh` of them new.
struct request_spec {
  int64_t context;
  int64_t fresh;
};

struct shape_spec {
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t head_dim = 8;
  int64_t block_size = 4;
  at::ScalarType dtype = at::kFloat;
  at::ScalarType table_dtype = at::kInt;
};

/// A random paged step and its dense reference, computed independently of
/// the kernel: per request a contiguous K/V [L, n_kv, D], K/V repeated per
/// query head, plain matmul + causal mask + softmax in fp64.
struct paged_case {
  at::Tensor q; // [N, H, D]
  at::Tensor k_pool, v_pool;
  at::Tensor block_tables, context_lens, query_start;
  at::Tensor want; // [N, H, D] fp64
  double scale = 0;
};

paged_case make_case(const std::vector<request_spec>& reqs, const shape_spec& s, uint64_t seed) {
  torch::manual_seed(seed);
  const int64_t R = static_cast<int64_t>(reqs.size());
  const int64_t bs = s.block_size;
  int64_t needed = 0, widest = 0, N = 0;
  for (const auto& r : reqs) {
    const int64_t nb = (r.context + bs - 1) / bs;
    needed += nb;
    widest = std::max(widest, nb);
    N += r.fresh;
  }
  const int64_t num_blocks = 2 * needed + 3; // spare blocks hold garbage
  const int64_t max_blocks = widest + 1;     // a spare column too
  paged_case c;
  c.scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
  auto pool_shape = std::vector<int64_t>{num_blocks, bs, s.kv_heads, s.head_dim};
  auto k_pool = torch::randn(pool_shape, torch::kDouble);
  auto v_pool = torch::randn(pool_shape, torch::kDouble);
  auto k_flat = k_pool.view({-1, s.kv_heads, s.head_dim});
  auto v_flat = v_pool.view({-1, s.kv_heads, s.head_dim});
  // Shuffled, non-contiguous block ids; unused table entries hold -1.
  auto perm = torch::randperm(num_blocks, torch::kLong);
  auto tables = torch::full({R, max_blocks}, -1, torch::kLong);
  auto q = torch::randn({N, s.heads, s.head_dim}, torch::kDouble);
  auto want = torch::empty({N, s.heads, s.head_dim}, torch::kDouble);
  std::vector<int64_t> starts{0};
  int64_t next_block = 0;
  const int64_t group = s.heads / s.kv_heads;
  for (int64_t r = 0; r < R; ++r) {
    const int64_t L = reqs[r].context, n = reqs[r].fresh;
    auto k = torch::randn({L, s.kv_heads, s.head_dim}, torch::kDouble);
    auto v = torch::randn({L, s.kv_heads, s.head_dim}, torch::kDouble);
    for (int64_t p = 0; p < L; ++p) {
      if (p % bs == 0)
        tables.index_put_({r, p / bs}, perm[2 * next_block++ % num_blocks]);
      const int64_t slot = tables.index({r, p / bs}).item<int64_t>() * bs + p % bs;
      k_flat[slot].copy_(k[p]);
      v_flat[slot].copy_(v[p]);
    }
    // Reference: K/V per query head (head h uses kv head h / group).
    auto kh = k.repeat_interleave(group, 1).permute({1, 0, 2}); // [H, L, D]
    auto vh = v.repeat_interleave(group, 1).permute({1, 0, 2});
    auto qh = q.narrow(0, starts.back(), n).permute({1, 0, 2});    // [H, n, D]
    auto scores = torch::matmul(qh, kh.transpose(1, 2)) * c.scale; // [H, n, L]
    auto pos = torch::arange(L - n, L, torch::kLong).unsqueeze(1);
    auto key = torch::arange(L, torch::kLong).unsqueeze(0);
    scores = scores.masked_fill(key > pos, -INFINITY);
    auto out = torch::matmul(torch::softmax(scores, -1), vh); // [H, n, D]
    want.narrow(0, starts.back(), n).copy_(out.permute({1, 0, 2}));
    starts.push_back(starts.back() + n);
  }
  c.q = q.to(s.dtype);
  c.k_pool = k_pool.to(s.dtype);
  c.v_pool = v_pool.to(s.dtype);
  c.block_tables = tables.to(s.table_dtype);
  c.context_lens = torch::empty({R}, torch::kLong);
  for (int64_t r = 0; r < R; ++r)
    c.context_lens[r] = reqs[r].context;
  c.query_start = torch::tensor(starts, torch::kLong);
  c.want = want;
  return c;
}

expected<at::Tensor> run(const paged_case& c) {
  return paged_attention(c.q, c.k_pool, c.v_pool, c.block_tables, c.context_lens, c.query_start,
                         c.scale);
}

// Prefill chunks, whole prompts and decodes; contexts not multiples of the block size.
const std::vector<request_spec> mixed = {{13, 13}, {1, 1}, {9, 1}, {21, 5},
                                         {16, 1},  {7, 3}, {4, 4}, {33, 2}};

} // namespace

TEST(paged_attention, matches_dense_reference_on_mixed_varlen_steps) {
  uint64_t seed = 100;
  for (int64_t bs : {4, 16}) {
    for (auto table_dtype : {at::kInt, at::kLong}) {
      shape_spec s;
      s.block_size = bs;
      s.table_dtype = table_dtype;
      auto c = make_case(mixed, s, seed++);
      auto out = value_of(run(c));
      ASSERT_EQ(out.sizes(), c.q.sizes());
      EXPECT_EQ(out.scalar_type(), at::kFloat);
      expect_close(out, c.want, 1e-5, "block_size " + std::to_string(bs));
    }
  }
}

TEST(paged_attention, matches_dense_reference_for_mha_and_mqa) {
  for (int64_t kv : {1, 4}) {
    shape_spec s;
    s.kv_heads = kv;
    s.head_dim = 16;
    auto c = make_case(mixed, s, 7 + kv);
    expect_close(value_of(run(c)), c.want, 1e-5, "n_kv " + std::to_string(kv));
  }
}

TEST(paged_attention, decode_fast_path_matches_general_path_and_reference) {
  shape_spec s;
  s.block_size = 4;
  // Five decodes plus one prefill chunk (general path), then the five decodes
  // alone over the same pools (fast path).
  auto general = make_case({{1, 1}, {5, 1}, {8, 1}, {17, 1}, {30, 1}, {11, 6}}, s, 21);
  auto fast = general;
  fast.q = general.q.narrow(0, 0, 5);
  fast.block_tables = general.block_tables.narrow(0, 0, 5);
  fast.context_lens = general.context_lens.narrow(0, 0, 5);
  fast.query_start = general.query_start.narrow(0, 0, 6);
  fast.want = general.want.narrow(0, 0, 5);
  auto a = value_of(run(fast));
  auto b = value_of(run(general));
  expect_close(a, fast.want, 1e-5, "fast path");
  expect_close(b, general.want, 1e-5, "general path");
  expect_close(a, b.narrow(0, 0, 5), 1e-6, "fast vs general");
}

TEST(paged_attention, decode_steps_in_every_dtype_match_the_reference) {
  // fp32/fp64 decodes run the CPU paged kernel, bf16/fp16 the gather path.
  const std::vector<request_spec> decodes = {{1, 1}, {6, 1}, {16, 1}, {17, 1}, {40, 1}};
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf}) {
    shape_spec s;
    s.dtype = dtype;
    s.kv_heads = 1; // GQA with 4 query heads per kv head
    auto c = make_case(decodes, s, 41);
    auto got = value_of(run(c));
    EXPECT_EQ(got.scalar_type(), dtype);
    const double tol = dtype == at::kDouble ? 1e-12
                       : dtype == at::kFloat ? 1e-5
                       : dtype == at::kBFloat16 ? 5e-2 : 1e-2;
    expect_close(got, c.want, tol, c10::toString(dtype));
  }
}

TEST(paged_attention, fp64_is_exact_and_bf16_is_close) {
  shape_spec s;
  s.dtype = at::kDouble;
  auto c = make_case(mixed, s, 31);
  auto out = value_of(run(c));
  EXPECT_EQ(out.scalar_type(), at::kDouble);
  expect_close(out, c.want, 1e-12, "fp64");
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    s.dtype = dtype;
    auto low = make_case(mixed, s, 32);
    auto got = value_of(run(low));
    EXPECT_EQ(got.scalar_type(), dtype);
    // The reference saw the unrounded inputs: loose tolerance.
    expect_close(got, low.want, dtype == at::kBFloat16 ? 5e-2 : 1e-2, c10::toString(dtype));
  }
}

TEST(paged_attention, requests_sharing_blocks_read_the_same_keys) {
  shape_spec s;
  auto c = make_case({{10, 1}, {10, 1}}, s, 41);
  // Point request 1 at request 0's blocks and give it the same query.
  c.block_tables[1].copy_(c.block_tables[0]);
  c.q[1].copy_(c.q[0]);
  auto out = value_of(run(c));
  expect_close(out[1], out[0], 1e-7);
  expect_close(out[1], c.want[0], 1e-5);
}

TEST(paged_attention, empty_step_gives_empty_output) {
  shape_spec s;
  auto c = make_case({{3, 1}}, s, 51);
  auto out = value_of(
      paged_attention(c.q.narrow(0, 0, 0), c.k_pool, c.v_pool, c.block_tables.narrow(0, 0, 0),
                      torch::empty({0}, torch::kLong), torch::zeros({1}, torch::kLong), c.scale));
  EXPECT_EQ(out.sizes(), (std::vector<int64_t>{0, 4, 8}));
}

TEST(write_kv, writes_rows_at_their_slots_only) {
  torch::manual_seed(61);
  auto k_pool = torch::zeros({5, 4, 2, 8});
  auto v_pool = torch::zeros({5, 4, 2, 8});
  auto k = torch::randn({6, 2, 8});
  auto v = torch::randn({6, 2, 8});
  auto slots = torch::tensor({19, 0, 7, 8, 3, 12}, torch::kLong);
  ASSERT_TRUE(write_kv(k_pool, v_pool, k, v, slots));
  auto kf = k_pool.view({20, 2, 8});
  auto vf = v_pool.view({20, 2, 8});
  EXPECT_TRUE(torch::equal(kf.index_select(0, slots), k));
  EXPECT_TRUE(torch::equal(vf.index_select(0, slots), v));
  EXPECT_EQ(kf.abs().sum().item<double>(), k.abs().sum().item<double>()); // nothing else written
  // int32 slots and an empty write work too.
  ASSERT_TRUE(write_kv(k_pool, v_pool, k.narrow(0, 0, 1), v.narrow(0, 0, 1),
                       torch::tensor({4}, torch::kInt)));
  EXPECT_TRUE(torch::equal(kf[4], k[0]));
  ASSERT_TRUE(write_kv(k_pool, v_pool, k.narrow(0, 0, 0), v.narrow(0, 0, 0),
                       torch::empty({0}, torch::kLong)));
}

TEST(write_kv, then_paged_attention_reads_what_was_written) {
  // Fill a request's context through write_kv, one chunk at a time, and compare.
  shape_spec s;
  auto c = make_case({{11, 11}}, s, 71);
  auto k_flat = c.k_pool.view({-1, 2, 8});
  auto v_flat = c.v_pool.view({-1, 2, 8});
  auto slots = torch::empty({11}, torch::kLong);
  for (int64_t p = 0; p < 11; ++p)
    slots[p] = c.block_tables.index({0, p / 4}).item<int64_t>() * 4 + p % 4;
  auto k = k_flat.index_select(0, slots).clone();
  auto v = v_flat.index_select(0, slots).clone();
  k_flat.zero_();
  v_flat.zero_();
  ASSERT_TRUE(
      write_kv(c.k_pool, c.v_pool, k.narrow(0, 0, 6), v.narrow(0, 0, 6), slots.narrow(0, 0, 6)));
  ASSERT_TRUE(
      write_kv(c.k_pool, c.v_pool, k.narrow(0, 6, 5), v.narrow(0, 6, 5), slots.narrow(0, 6, 5)));
  expect_close(value_of(run(c)), c.want, 1e-5);
}

TEST(paged_attention, rejects_bad_steps_with_clear_errors) {
  shape_spec s;
  auto c = make_case({{6, 2}, {9, 1}}, s, 81); // N = 3, block_size 4
  auto with = [&](auto edit) {
    auto d = c;
    d.block_tables = c.block_tables.clone();
    d.context_lens = c.context_lens.clone();
    d.query_start = c.query_start.clone();
    edit(d);
    return run(d);
  };
  expect_error(with([](paged_case& d) { d.query_start[2] = 4; }), errc::shape_mismatch,
               "query_start[2] = 4, but q has 3 token rows");
  expect_error(with([](paged_case& d) {
                 d.query_start = torch::tensor({0, 3}, torch::kLong);
               }),
               errc::shape_mismatch, "query_start has shape [2], expected [3]");
  expect_error(with([](paged_case& d) {
                 d.query_start[1] = 3;
                 d.query_start[2] = 3;
               }),
               errc::invalid_argument, "request 1 has 0 new tokens");
  expect_error(with([](paged_case& d) { d.query_start[0] = 1; }), errc::invalid_argument,
               "query_start[0] = 1, expected 0");
  expect_error(with([](paged_case& d) { d.context_lens[0] = 1; }), errc::invalid_argument,
               "request 0 has context_lens = 1, less than its 2 new tokens");
  // Request 1's 9 tokens need 3 blocks of 4; give the table only 2 columns.
  expect_error(with([](paged_case& d) { d.block_tables = d.block_tables.narrow(1, 0, 2); }),
               errc::out_of_range,
               "request 1 has context length 9, which needs 3 blocks of 4 tokens, but "
               "block_tables has only 2 columns");
  expect_error(with([](paged_case& d) { d.context_lens[1] = 100; }), errc::out_of_range,
               "needs 25 blocks");
  expect_error(with([](paged_case& d) {
                 d.block_tables.index_put_({1, 2}, 999);
               }),
               errc::out_of_range, "block_tables[1][2] = 999 is outside the pool's blocks");
  expect_error(with([](paged_case& d) {
                 d.block_tables.index_put_({0, 0}, -2);
               }),
               errc::out_of_range, "block_tables[0][0] = -2");
  expect_error(with([](paged_case& d) { d.block_tables = d.block_tables.to(at::kFloat); }),
               errc::shape_mismatch, "expected int32 or int64");
  expect_error(with([](paged_case& d) { d.context_lens = torch::tensor({6}, torch::kLong); }),
               errc::shape_mismatch, "context_lens has shape [1], expected [2]");
  expect_error(with([](paged_case& d) { d.q = d.q.to(at::kDouble); }), errc::shape_mismatch,
               "q has dtype Double, expected Float like k_pool");
  expect_error(with([](paged_case& d) { d.q = d.q.narrow(1, 0, 3); }), errc::shape_mismatch,
               "H a multiple of n_kv = 2");
  expect_error(with([](paged_case& d) { d.q = d.q.narrow(2, 0, 4); }), errc::shape_mismatch,
               "q has shape [3, 4, 4], expected [N, H, 8]");
  expect_error(with([](paged_case& d) { d.v_pool = d.v_pool.narrow(0, 0, 2); }),
               errc::shape_mismatch, "v_pool has shape");
  expect_error(
      with([](paged_case& d) { d.k_pool = d.k_pool.transpose(2, 3).contiguous().transpose(2, 3); }),
      errc::invalid_argument, "must be contiguous");
  expect_error(with([](paged_case& d) { d.scale = 0; }), errc::invalid_argument, "scale");
  expect_error(with([](paged_case& d) { d.q = d.q[0]; }), errc::shape_mismatch,
               "q has shape [4, 8], expected 3 dimensions [N, H, D]");
}

TEST(write_kv, rejects_bad_inputs_with_clear_errors) {
  auto k_pool = torch::zeros({5, 4, 2, 8});
  auto v_pool = torch::zeros({5, 4, 2, 8});
  auto k = torch::randn({3, 2, 8});
  auto v = torch::randn({3, 2, 8});
  auto slots = torch::tensor({1, 20, 2}, torch::kLong);
  expect_error(write_kv(k_pool, v_pool, k, v, slots), errc::out_of_range,
               "slot_mapping[1] = 20 is outside the pool's slots [0, 20) (5 blocks of 4)");
  expect_error(write_kv(k_pool, v_pool, k, v, torch::tensor({1, -1, 2}, torch::kLong)),
               errc::out_of_range, "slot_mapping[1] = -1");
  expect_error(write_kv(k_pool, v_pool, k, v, torch::tensor({1, 2}, torch::kLong)),
               errc::shape_mismatch, "slot_mapping has shape [2], expected [3]");
  expect_error(write_kv(k_pool, v_pool, k, v, torch::tensor({1.0, 2.0, 3.0})), errc::shape_mismatch,
               "slot_mapping has dtype Float");
  auto k3 = torch::randn({3, 1, 8});
  expect_error(write_kv(k_pool, v_pool, k3, k3, torch::tensor({0, 1, 2})), errc::shape_mismatch,
               "k has shape [3, 1, 8], expected [N, 2, 8]");
  expect_error(
      write_kv(k_pool, v_pool, k.to(at::kDouble), v.to(at::kDouble), torch::tensor({0, 1, 2})),
      errc::shape_mismatch, "k has dtype Double, expected Float like k_pool");
  expect_error(write_kv(k_pool, v_pool, k, v.narrow(0, 0, 2), torch::tensor({0, 1, 2})),
               errc::shape_mismatch, "v has shape [2, 2, 8], expected [3, 2, 8] like k");
  auto pool3 = torch::zeros({5, 4, 16});
  expect_error(write_kv(pool3, pool3, k, v, torch::tensor({0, 1, 2})), errc::shape_mismatch,
               "k_pool has shape [5, 4, 16], expected 4 dimensions");
  // Nothing was written by the failed calls.
  EXPECT_EQ(k_pool.abs().sum().item<double>(), 0.0);
}
