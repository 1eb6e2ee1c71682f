// Bucketed gradient all-reduce: bucket plan, and data parallelism over two
// gloo ranks matching one process on the same global batch.
#include "runtime/collectives.hpp"
#include "runtime/gradient_reducer.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <future>

using namespace troupe;
using namespace troupe::runtime;

namespace {

local_groups two_ranks(const std::string& name) {
  group_options go;
  go.name = name;
  go.timeout_ms = 20000;
  auto s = make_local_groups(2, go);
  EXPECT_TRUE(s) << (s ? "" : describe(s.error()));
  return s ? std::move(*s) : local_groups{};
}

// A two-layer MLP as plain leaf tensors.
std::vector<torch::Tensor> make_params(int64_t seed) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> p{torch::randn({5, 16}), torch::randn({16}), torch::randn({16, 1}),
                               torch::randn({1})};
  for (auto& t : p)
    t.set_requires_grad(true);
  return p;
}

// Sum of squared errors of rows [begin, end), divided by the global batch.
torch::Tensor loss_of(const std::vector<torch::Tensor>& p, const torch::Tensor& x,
                      const torch::Tensor& y, int64_t begin, int64_t end, int64_t global) {
  auto xs = x.slice(0, begin, end);
  auto h = torch::tanh(xs.matmul(p[0]) + p[1]);
  auto out = h.matmul(p[2]).squeeze(1) + p[3];
  return (out - y.slice(0, begin, end)).pow(2).sum() / static_cast<double>(global);
}

} // namespace

TEST(GradientReducer, BucketsInReverseOrderBySizeAndDtype) {
  auto ranks = two_ranks("buckets");
  std::vector<torch::Tensor> params{torch::zeros({100}), torch::zeros({10}), torch::zeros({2000}),
                                    torch::zeros({10}, torch::kDouble), torch::zeros({20})};
  reducer_options o;
  o.bucket_bytes = 1000;
  auto r = gradient_reducer::make(params, ranks.groups[0], o);
  ASSERT_TRUE(r) << describe(r.error());
  std::vector<std::vector<size_t>> want{{4}, {3}, {2}, {1, 0}};
  EXPECT_EQ(r->buckets(), want);

  std::vector<torch::Tensor> ints{torch::zeros({3}, torch::kLong)};
  EXPECT_FALSE(gradient_reducer::make(ints, ranks.groups[0], o));
  o.bucket_bytes = 0;
  EXPECT_FALSE(gradient_reducer::make(params, ranks.groups[0], o));
}

TEST(GradientReducer, TwoRanksMatchOneProcessOnTheSameGlobalBatch) {
  torch::manual_seed(7);
  const int64_t batch = 8;
  auto x = torch::randn({batch, 5});
  auto y = torch::randn({batch});

  // One process, whole batch.
  auto single = make_params(1);
  torch::optim::Adam single_opt(single, torch::optim::AdamOptions(0.01));
  std::vector<std::vector<torch::Tensor>> single_grads;
  for (int step = 0; step < 5; ++step) {
    single_opt.zero_grad();
    loss_of(single, x, y, 0, batch, batch).backward();
    std::vector<torch::Tensor> g;
    for (auto& p : single)
      g.push_back(p.grad().clone());
    single_grads.push_back(std::move(g));
    single_opt.step();
  }

  // Two ranks, half the batch each; rank 1 starts from other weights and
  // gets rank 0's by the broadcast.
  auto ranks = two_ranks("dp");
  // Made here: torch's default generator is global, not per thread.
  std::vector<std::vector<torch::Tensor>> start{make_params(1), make_params(99)};
  auto rank_run = [&](int rank) -> std::vector<torch::Tensor> {
    auto p = start[static_cast<size_t>(rank)];
    auto& g = ranks.groups[static_cast<size_t>(rank)];
    EXPECT_TRUE(broadcast_parameters(p, g, 0));
    reducer_options o;
    o.bucket_bytes = 128; // several buckets
    auto r = gradient_reducer::make(p, g, o);
    EXPECT_TRUE(r);
    torch::optim::Adam opt(p, torch::optim::AdamOptions(0.01));
    for (int step = 0; step < 5; ++step) {
      opt.zero_grad();
      auto half = batch / 2;
      loss_of(p, x, y, rank * half, (rank + 1) * half, batch).backward();
      EXPECT_TRUE(r->all_reduce(1.0)); // per-rank sums of a global mean: add them
      for (size_t i = 0; i < p.size(); ++i)
        EXPECT_TRUE(torch::allclose(p[i].grad(), single_grads[static_cast<size_t>(step)][i], 1e-6,
                                    1e-6))
            << "rank " << rank << " step " << step << " param " << i;
      opt.step();
    }
    return p;
  };
  auto other = std::async(std::launch::async, rank_run, 1);
  auto p0 = rank_run(0);
  auto p1 = other.get();
  for (size_t i = 0; i < single.size(); ++i) {
    EXPECT_LT((p0[i] - single[i]).abs().max().item<double>(), 1e-5) << "param " << i;
    EXPECT_TRUE(torch::equal(p0[i], p1[i])) << "ranks diverged at param " << i;
  }
}

TEST(GradientReducer, AParameterWithoutAGradientCountsAsZeros) {
  auto ranks = two_ranks("missing");
  auto rank_run = [&](int rank) -> torch::Tensor {
    auto a = torch::ones({4}).set_requires_grad(true);
    auto b = torch::ones({4}).set_requires_grad(true);
    // Rank 0 uses both, rank 1 only `a`: b has no gradient there.
    auto loss = rank == 0 ? (a * 2).sum() + (b * 3).sum() : (a * 5).sum();
    loss.backward();
    std::vector<torch::Tensor> params{a, b};
    auto r = gradient_reducer::make(params, ranks.groups[static_cast<size_t>(rank)]);
    EXPECT_TRUE(r);
    EXPECT_TRUE(r->all_reduce(0.5));
    EXPECT_TRUE(torch::allclose(a.grad(), torch::full({4}, 3.5)));
    return b.grad();
  };
  auto other = std::async(std::launch::async, rank_run, 1);
  auto b0 = rank_run(0);
  auto b1 = other.get();
  EXPECT_TRUE(torch::allclose(b0, torch::full({4}, 1.5)));
  EXPECT_TRUE(torch::allclose(b1, torch::full({4}, 1.5)));
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
