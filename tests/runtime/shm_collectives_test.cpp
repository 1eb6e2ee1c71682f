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
#include <functional>
#include <optional>
#include <thread>

using namespace troupe;
using namespace troupe::runtime;
using troupe::testing::on_every_rank;

namespace {

// Each rank's group wrapped by `wrap` (its group and its store client).
std::vector<process_group>
wrapped_ranks(local_groups& ranks,
              const std::function<expected<process_group>(process_group, store&)>& wrap) {
  return on_every_rank<process_group>(ranks.groups, [&](process_group& g) {
    const auto r = static_cast<size_t>(g.rank());
    auto shm = wrap(std::move(g), ranks.stores[r]);
    EXPECT_TRUE(shm) << describe(shm.error());
    return shm ? std::move(*shm) : process_group{};
  });
}

// `world` ranks, each wrapped (slot of `slot` bytes, `timeout_ms`).
std::vector<process_group> shm_ranks(local_groups& ranks, int64_t slot,
                                     int64_t timeout_ms = 30000) {
  return wrapped_ranks(ranks, [&](process_group g, store& s) {
    return with_shm_collectives(std::move(g), s, "test", slot, timeout_ms);
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

// NOTE [shm point-to-point]: two ranks named `name`, with mailboxes of
// `slots` slots of `slot` bytes (`ranks` keeps their stores).
std::vector<process_group> p2p_pair(std::optional<local_groups>& ranks, const std::string& name,
                                    int64_t slot, int slots, int64_t timeout_ms = 30000) {
  group_options go;
  go.name = name;
  auto made = make_local_groups(2, go);
  EXPECT_TRUE(made) << describe(made.error());
  if (!made)
    return {};
  ranks = std::move(*made);
  return wrapped_ranks(*ranks, [&](process_group g, store& s) {
    return with_shm_point_to_point(std::move(g), s, "p2p", slot, slots, timeout_ms);
  });
}

// A pipeline's pattern: rank 0 sends its activations ahead (started, not
// waited for) while rank 1 sends gradients back; each receive takes its
// tag's message, received in another order than sent, with equal bits; a
// tensor above the slot goes through gloo on both ends; the collectives
// still work.
TEST(ShmPointToPoint, SendsAndReceivesByTagWithEqualBitsLargerOnesOverGloo) {
  std::optional<local_groups> ranks;
  auto g = p2p_pair(ranks, "shm-p2p", 1024, 4);
  ASSERT_EQ(g.size(), 2u);
  torch::manual_seed(3);
  std::vector<at::Tensor> acts{torch::randn({16}), torch::randn({16}), torch::randn({16})};
  auto big = torch::randn({1000}); // 4000 bytes: above the slot
  auto grads = std::vector<at::Tensor>{torch::randn({8}), torch::randn({8})};
  auto errors = on_every_rank<std::string>(g, [&](process_group& pg) -> std::string {
    std::string out;
    auto check = [&](const expected<void>& ok) {
      if (!ok)
        out += describe(ok.error()) + "; ";
    };
    if (pg.rank() == 0) {
      std::vector<std::unique_ptr<pending_transfer>> sent;
      for (int m = 0; m < 3; ++m)
        sent.push_back(std::move(*pg.start_send(acts[static_cast<size_t>(m)], 1, 2 * m)));
      sent.push_back(std::move(*pg.start_send(big, 1, 99)));
      for (int m : {1, 0}) { // gradients taken in the other order
        auto t = torch::empty({8});
        check(pg.recv(t, 1, 2 * m + 1));
        if (!torch::equal(t, grads[static_cast<size_t>(m)]))
          out += "gradient " + std::to_string(m) + " differs; ";
      }
      for (auto& s : sent)
        check(s->wait());
    } else {
      for (int m = 0; m < 2; ++m)
        check(pg.send(grads[static_cast<size_t>(m)], 0, 2 * m + 1));
      auto large = torch::empty({1000});
      check(pg.recv(large, 0, 99));
      if (!torch::equal(large, big))
        out += "the large tensor differs; ";
      for (int m : {2, 0, 1}) {
        auto t = torch::empty({16});
        check(pg.recv(t, 0, 2 * m));
        if (!torch::equal(t, acts[static_cast<size_t>(m)]))
          out += "activation " + std::to_string(m) + " differs; ";
      }
    }
    auto sum = torch::ones({4});
    check(pg.all_reduce_sum(sum));
    if (!torch::equal(sum, torch::full({4}, 2.0f)))
      out += "the sum is wrong; ";
    return out;
  });
  for (const auto& e : errors)
    EXPECT_EQ(e, "");
}

// A sender whose mailbox is full waits for the receiver to free a slot:
// 6 messages through 1 slot arrive in order; the same tag repeated is
// taken oldest first.
TEST(ShmPointToPoint, AFullMailboxWaitsForTheReceiverAndKeepsTheOrder) {
  std::optional<local_groups> ranks;
  auto g = p2p_pair(ranks, "shm-p2p-full", 64, 1);
  ASSERT_EQ(g.size(), 2u);
  auto got = on_every_rank<std::vector<float>>(g, [&](process_group& pg) {
    std::vector<float> out;
    for (int i = 0; i < 6; ++i) {
      auto t = torch::full({4}, static_cast<float>(i));
      if (pg.rank() == 0) {
        EXPECT_TRUE(pg.send(t, 1, 7));
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        EXPECT_TRUE(pg.recv(t, 0, 7));
        out.push_back(t[0].item<float>());
      }
    }
    return out;
  });
  EXPECT_EQ(got[1], (std::vector<float>{0, 1, 2, 3, 4, 5}));
}

// A receive nothing comes for is a timeout naming the rank and tag; a
// message of another size than the receiver's tensor is refused.
TEST(ShmPointToPoint, NothingComingIsATimeoutAndAWrongSizeIsRefused) {
  std::optional<local_groups> ranks;
  auto g = p2p_pair(ranks, "shm-p2p-timeout", 1024, 2, 300);
  ASSERT_EQ(g.size(), 2u);
  auto t = torch::empty({4});
  const auto t0 = std::chrono::steady_clock::now();
  auto ok = g[0].recv(t, 1, 5);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(ok);
  EXPECT_EQ(code_of(ok.error()), errc::timeout);
  EXPECT_NE(
      describe(ok.error()).find("shm receive from rank 1 (tag 5): nothing came within 300 ms"),
      std::string::npos)
      << describe(ok.error());
  EXPECT_LT(waited, 5.0);
  auto eight = torch::ones({8});
  ASSERT_TRUE(g[1].send(eight, 0, 6));
  auto four = torch::empty({4});
  auto wrong = g[0].recv(four, 1, 6);
  ASSERT_FALSE(wrong);
  EXPECT_NE(describe(wrong.error()).find("32 bytes sent, 16 expected"), std::string::npos)
      << describe(wrong.error());
}

} // namespace
