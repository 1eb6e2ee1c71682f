// NOTE [shm all-reduce]: a group's float sums and all-gathers through
// shared memory give what the gloo group gives, the same bits on every
// rank, over many calls in a row (the two alternating buffers); larger or
// non-float calls go to the wrapped group; a rank that does not come is a
// timeout naming it.
#include "runtime/collectives.hpp"
#include "runtime/shm_collectives.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>

using namespace troupe;
using namespace troupe::runtime;
using troupe::testing::on_every_rank;

namespace {

// `world` ranks, each wrapped (slot of `slot` bytes, `timeout_ms`).
std::vector<process_group> shm_ranks(local_groups& ranks, int64_t slot,
                                     int64_t timeout_ms = 30000) {
  return on_every_rank<process_group>(ranks.groups, [&](process_group& g) {
    const auto r = static_cast<size_t>(g.rank());
    auto shm = with_shm_collectives(std::move(g), ranks.stores[r], "test", slot, timeout_ms);
    EXPECT_TRUE(shm) << describe(shm.error());
    return shm ? std::move(*shm) : process_group{};
  });
}

TEST(ShmCollectives, SumsAndGathersLikeGlooWithEqualBitsOnEveryRank) {
  group_options go;
  go.name = "shm-sum";
  auto ranks = make_local_groups(3, go);
  ASSERT_TRUE(ranks) << describe(ranks.error());
  auto shm = shm_ranks(*ranks, 64 * 1024);
  struct result {
    std::vector<torch::Tensor> sums, gathers;
  };
  auto results = on_every_rank<result>(shm, [&](process_group& g) {
    result out;
    for (int call = 0; call < 500; ++call) { // alternating buffers, many times round
      auto gen = torch::make_generator<at::CPUGeneratorImpl>(call * 10 + g.rank());
      auto t = torch::randn({37 + call % 5}, gen);
      EXPECT_TRUE(g.all_reduce_sum(t));
      out.sums.push_back(t);
      auto mine = torch::full({4}, static_cast<float>(g.rank() * 1000 + call));
      auto all = torch::empty({12});
      EXPECT_TRUE(g.all_gather(mine, all));
      out.gathers.push_back(all);
    }
    return out;
  });
  for (int call = 0; call < 500; ++call) {
    auto want = torch::zeros({37 + call % 5});
    for (int r = 0; r < 3; ++r)
      want +=
          torch::randn({37 + call % 5}, torch::make_generator<at::CPUGeneratorImpl>(call * 10 + r));
    for (int r = 0; r < 3; ++r) {
      const auto& got = results[static_cast<size_t>(r)];
      ASSERT_TRUE(torch::allclose(got.sums[static_cast<size_t>(call)], want, 1e-6, 1e-5)) << call;
      EXPECT_TRUE(torch::equal(got.sums[static_cast<size_t>(call)],
                               results[0].sums[static_cast<size_t>(call)]))
          << "rank " << r << " call " << call;
      for (int k = 0; k < 3; ++k)
        EXPECT_EQ(got.gathers[static_cast<size_t>(call)][k * 4].item<float>(),
                  static_cast<float>(k * 1000 + call));
    }
  }
}

TEST(ShmCollectives, LargerAndIntegerCallsGoToTheWrappedGroup) {
  group_options go;
  go.name = "shm-fallback";
  auto ranks = make_local_groups(2, go);
  ASSERT_TRUE(ranks);
  auto shm = shm_ranks(*ranks, 1024); // 256 floats a slot
  auto results = on_every_rank<std::vector<torch::Tensor>>(shm, [&](process_group& g) {
    auto big = torch::full({1000}, static_cast<float>(g.rank() + 1));
    auto ints = torch::full({8}, static_cast<int64_t>(g.rank() + 1), torch::kLong);
    auto small = torch::full({8}, 0.5f);
    EXPECT_TRUE(g.all_reduce_sum(big));
    EXPECT_TRUE(g.all_reduce_sum(ints));
    EXPECT_TRUE(g.all_reduce_sum(small));
    auto t = torch::full({2}, 7.0f);
    EXPECT_TRUE(g.broadcast(t, 1));
    return std::vector<torch::Tensor>{big, ints, small, t};
  });
  for (const auto& r : results) {
    EXPECT_TRUE(torch::equal(r[0], torch::full({1000}, 3.0f)));
    EXPECT_TRUE(torch::equal(r[1], torch::full({8}, int64_t{3}, torch::kLong)));
    EXPECT_TRUE(torch::equal(r[2], torch::full({8}, 1.0f)));
    EXPECT_TRUE(torch::equal(r[3], torch::full({2}, 7.0f)));
  }
}

TEST(ShmCollectives, ARankThatDoesNotComeIsATimeoutNamingIt) {
  group_options go;
  go.name = "shm-timeout";
  auto ranks = make_local_groups(2, go);
  ASSERT_TRUE(ranks);
  auto shm = shm_ranks(*ranks, 1024, 300);
  auto t = torch::ones({4});
  const auto t0 = std::chrono::steady_clock::now();
  auto ok = shm[0].all_reduce_sum(t); // rank 1 never calls
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(ok);
  EXPECT_EQ(code_of(ok.error()), errc::timeout);
  EXPECT_NE(describe(ok.error()).find("rank 1 did not come within 300 ms"), std::string::npos)
      << describe(ok.error());
  EXPECT_LT(waited, 5.0);
}

} // namespace
