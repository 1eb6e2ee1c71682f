// The bucketed parameter broadcast that starts data-parallel training.
#include "runtime/collectives.hpp"
#include "runtime/gradient_reducer.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <future>

using namespace troupe;
using namespace troupe::runtime;

namespace {

local_groups reducer_ranks(const std::string& name) {
  group_options go;
  go.name = name;
  go.timeout_ms = 20000;
  auto s = make_local_groups(2, go);
  EXPECT_TRUE(s) << (s ? "" : describe(s.error()));
  return s ? std::move(*s) : local_groups{};
}

} // namespace

// Rank 1 starts from other weights (one of them fp64: a bucket of its own)
// and ends with rank 0's, bucket by bucket.
TEST(BroadcastParameters, EveryRankEndsWithTheRootsWeights) {
  auto ranks = reducer_ranks("broadcast");
  auto params = [](int64_t seed) {
    torch::manual_seed(seed);
    return std::vector<torch::Tensor>{torch::randn({5, 16}), torch::randn({16}),
                                      torch::randn({16, 1}, torch::kDouble), torch::randn({1})};
  };
  std::vector<std::vector<torch::Tensor>> start{params(1), params(99)};
  auto want = params(1);
  auto rank_run = [&](int rank) {
    auto& p = start[static_cast<size_t>(rank)];
    EXPECT_TRUE(broadcast_parameters(p, ranks.groups[static_cast<size_t>(rank)], 0, 128));
  };
  auto other = std::async(std::launch::async, rank_run, 1);
  rank_run(0);
  other.get();
  for (size_t i = 0; i < want.size(); ++i)
    for (const auto& rank : start)
      EXPECT_TRUE(torch::equal(rank[i], want[i])) << "param " << i;
}

TEST(BroadcastParameters, RefusesIntegerParametersAndAnEmptyBucket) {
  auto ranks = reducer_ranks("broadcast-bad");
  std::vector<torch::Tensor> ints{torch::zeros({3}, torch::kLong)};
  EXPECT_FALSE(broadcast_parameters(ints, ranks.groups[0]));
  std::vector<torch::Tensor> floats{torch::zeros({3})};
  EXPECT_FALSE(broadcast_parameters(floats, ranks.groups[0], 0, 0));
}

TEST(Collectives, ConnectTcpStoreChecksTheAddressAndMeetsTheServer) {
  for (std::string bad : {"", "localhost", ":80", "host:", "host:abc", "host:70000", "host:12a"}) {
    auto s = connect_tcp_store(bad, 1000);
    ASSERT_FALSE(s) << bad;
    EXPECT_NE(describe(s.error()).find("expected host:port"), std::string::npos) << describe(s.error());
  }
  store_options so;
  so.is_server = true;
  auto server = make_tcp_store(so);
  ASSERT_TRUE(server) << describe(server.error());
  auto client = connect_tcp_store("127.0.0.1:" + std::to_string(server->port()), 5000);
  ASSERT_TRUE(client) << describe(client.error());
  ASSERT_TRUE(client->set("k", "v"));
  auto v = server->get("k");
  ASSERT_TRUE(v);
  EXPECT_EQ(*v, "v");
}
