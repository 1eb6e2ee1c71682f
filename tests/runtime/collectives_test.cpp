// The collective vocabulary of runtime::process_group, each checked against
// its definition over real gloo ranks in this process (one thread a rank):
// all-gather and reduce-scatter rings with the bytes each rank moves,
// reduce / scatter / gather / all-to-all, tagged send / recv, sub-groups from
// a rank mesh, and faults injected into one rank (a rank that never arrives,
// one that comes too late, one that aborts mid-collective).
#include "runtime/collectives.hpp"

#include "tests/support/faulty_group.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <future>

using namespace troupe;
using namespace troupe::runtime;
using troupe::testing::on_every_rank;

namespace {

local_groups make_ranks(int world, const std::string& name, int64_t timeout_ms = 20000) {
  group_options go;
  go.name = name;
  go.timeout_ms = timeout_ms;
  auto s = make_local_groups(world, go);
  EXPECT_TRUE(s) << (s ? "" : describe(s.error()));
  return s ? std::move(*s) : local_groups{};
}

/// Rank r's input: a fixed pseudo-random tensor per (rank, seed).
torch::Tensor input_of(int rank, int64_t numel, int64_t seed = 0) {
  auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(1000 * seed + rank + 1));
  return torch::randn({numel}, gen, torch::kFloat);
}

void expect_ok(const expected<void>& r) {
  EXPECT_TRUE(r) << describe(r.error());
}

} // namespace

TEST(AllGather, RingConcatenatesInRankOrderAndSendsTextbookBytes) {
  for (int world : {1, 2, 3, 4}) {
    auto ranks = make_ranks(world, "ag" + std::to_string(world));
    const int64_t chunk = 6;
    auto outs = on_every_rank<torch::Tensor>(ranks.groups, [&](process_group& g) {
      auto in = input_of(g.rank(), chunk).reshape({2, 3});
      auto out = torch::full({world, 2, 3}, -1.0f);
      expect_ok(g.all_gather(in, out));
      return out;
    });
    std::vector<torch::Tensor> parts;
    for (int r = 0; r < world; ++r)
      parts.push_back(input_of(r, chunk));
    auto want = torch::cat(parts).reshape({world, 2, 3});
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(torch::equal(outs[r], want)) << "world " << world << " rank " << r;
      // (N-1)/N of the gathered buffer out, the same in.
      auto t = ranks.groups[r].traffic();
      EXPECT_EQ(t.bytes_sent, (world - 1) * chunk * 4) << "world " << world;
      EXPECT_EQ(t.bytes_received, (world - 1) * chunk * 4) << "world " << world;
    }
  }
}

TEST(ReduceScatter, SumMeanMaxMinMatchTheDefinitionWithTextbookBytes) {
  const int64_t chunk = 5;
  for (int world : {2, 3, 4}) {
    auto ranks = make_ranks(world, "rs" + std::to_string(world));
    int64_t sent_before = 0;
    for (auto op : {reduce_op::sum, reduce_op::mean, reduce_op::max, reduce_op::min}) {
      auto outs = on_every_rank<torch::Tensor>(ranks.groups, [&](process_group& g) {
        auto in = input_of(g.rank(), world * chunk, static_cast<int>(op));
        auto out = torch::zeros({chunk});
        expect_ok(g.reduce_scatter(in, out, op));
        return out;
      });
      std::vector<torch::Tensor> all;
      for (int r = 0; r < world; ++r)
        all.push_back(input_of(r, world * chunk, static_cast<int>(op)));
      auto stacked = torch::stack(all);
      torch::Tensor full = op == reduce_op::sum    ? stacked.sum(0)
                           : op == reduce_op::mean ? stacked.sum(0) / world
                           : op == reduce_op::max  ? std::get<0>(stacked.max(0))
                                                   : std::get<0>(stacked.min(0));
      for (int r = 0; r < world; ++r)
        EXPECT_TRUE(torch::allclose(outs[r], full.narrow(0, r * chunk, chunk), 1e-6, 1e-6))
            << to_string(op) << " world " << world << " rank " << r;
      // Each rank sends (N-1)/N of its input: N-1 chunks.
      auto sent = ranks.groups[0].traffic().bytes_sent - sent_before;
      EXPECT_EQ(sent, (world - 1) * chunk * 4) << to_string(op) << " world " << world;
      sent_before = ranks.groups[0].traffic().bytes_sent;
    }
  }
}

TEST(ReduceScatter, RefusesBadShapesBeforeSendingAnything) {
  auto ranks = make_ranks(2, "rsbad");
  auto& g = ranks.groups[0];
  auto out = torch::zeros({3});
  auto r = g.reduce_scatter(torch::zeros({7}), out, reduce_op::sum);
  ASSERT_FALSE(r);
  EXPECT_EQ(code_of(r.error()), errc::shape_mismatch);
  EXPECT_NE(context_of(r.error()).find("expected 2 x 3 elements"), std::string::npos)
      << describe(r.error());
  auto ints = torch::zeros({6}, torch::kLong);
  auto iout = torch::zeros({3}, torch::kLong);
  auto m = g.reduce_scatter(ints, iout, reduce_op::mean);
  ASSERT_FALSE(m);
  EXPECT_EQ(code_of(m.error()), errc::invalid_argument);
  auto strided = torch::zeros({6, 2}).t();
  auto s = g.all_gather(strided, out);
  ASSERT_FALSE(s);
  EXPECT_NE(context_of(s.error()).find("not contiguous"), std::string::npos);
  EXPECT_EQ(g.traffic().bytes_sent, 0);
}

TEST(AllReduce, EveryOpMatchesItsDefinition) {
  auto ranks = make_ranks(3, "ar");
  for (auto op : {reduce_op::sum, reduce_op::mean, reduce_op::max, reduce_op::min}) {
    auto outs = on_every_rank<torch::Tensor>(ranks.groups, [&](process_group& g) {
      auto t = input_of(g.rank(), 8).reshape({2, 4});
      expect_ok(g.all_reduce(t, op));
      return t;
    });
    auto stacked =
        torch::stack({input_of(0, 8), input_of(1, 8), input_of(2, 8)}).reshape({3, 2, 4});
    torch::Tensor want = op == reduce_op::sum    ? stacked.sum(0)
                         : op == reduce_op::mean ? stacked.sum(0) / 3
                         : op == reduce_op::max  ? std::get<0>(stacked.max(0))
                                                 : std::get<0>(stacked.min(0));
    for (auto& o : outs)
      EXPECT_TRUE(torch::allclose(o, want, 1e-6, 1e-6)) << to_string(op);
  }
}

TEST(Reduce, LandsOnTheRootOnly) {
  auto ranks = make_ranks(3, "reduce");
  for (auto op : {reduce_op::sum, reduce_op::mean}) {
    auto outs = on_every_rank<torch::Tensor>(ranks.groups, [&](process_group& g) {
      auto t = input_of(g.rank(), 4);
      expect_ok(g.reduce(t, 2, op));
      return t;
    });
    auto sum = input_of(0, 4) + input_of(1, 4) + input_of(2, 4);
    EXPECT_TRUE(torch::allclose(outs[2], op == reduce_op::sum ? sum : sum / 3, 1e-6, 1e-6));
  }
  auto t = torch::zeros({2});
  auto bad = ranks.groups[0].reduce(t, 3, reduce_op::sum);
  ASSERT_FALSE(bad);
  EXPECT_NE(context_of(bad.error()).find("root 3 outside [0, 3)"), std::string::npos);
}

TEST(Scatter, TheRootsInputsReachTheirRanks) {
  auto ranks = make_ranks(3, "scatter");
  auto outs = on_every_rank<torch::Tensor>(ranks.groups, [&](process_group& g) {
    std::vector<torch::Tensor> inputs;
    if (g.rank() == 1)
      for (int r = 0; r < 3; ++r)
        inputs.push_back(input_of(r, 6, 7).reshape({3, 2}));
    auto out = torch::zeros({3, 2});
    expect_ok(g.scatter(inputs, out, 1));
    return out;
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(torch::equal(outs[r], input_of(r, 6, 7).reshape({3, 2}))) << r;
  auto out = torch::zeros({2});
  auto bad = ranks.groups[0].scatter({torch::zeros({2})}, out, 0);
  ASSERT_FALSE(bad);
  EXPECT_NE(context_of(bad.error()).find("expected 3 inputs, got 1"), std::string::npos);
}

TEST(Gather, TheRootReceivesEveryRanksInput) {
  auto ranks = make_ranks(3, "gather");
  auto outs = on_every_rank<std::vector<torch::Tensor>>(ranks.groups, [&](process_group& g) {
    std::vector<torch::Tensor> outputs;
    if (g.rank() == 0)
      for (int r = 0; r < 3; ++r)
        outputs.push_back(torch::zeros({4}));
    expect_ok(g.gather(input_of(g.rank(), 4, 3), outputs, 0));
    return outputs;
  });
  ASSERT_EQ(outs[0].size(), 3u);
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(torch::equal(outs[0][r], input_of(r, 4, 3))) << r;
  EXPECT_TRUE(outs[1].empty());
}

TEST(AllToAll, ChunkJOfRankRGoesToChunkROfRankJ) {
  const int world = 3;
  const int64_t chunk = 2;
  auto ranks = make_ranks(world, "a2a");
  auto outs = on_every_rank<torch::Tensor>(ranks.groups, [&](process_group& g) {
    auto in = input_of(g.rank(), world * chunk, 5);
    auto out = torch::zeros({world * chunk});
    expect_ok(g.all_to_all(in, out));
    return out;
  });
  for (int r = 0; r < world; ++r)
    for (int j = 0; j < world; ++j)
      EXPECT_TRUE(torch::equal(outs[r].narrow(0, j * chunk, chunk),
                               input_of(j, world * chunk, 5).narrow(0, r * chunk, chunk)))
          << "rank " << r << " chunk " << j;
  auto out = torch::zeros({4});
  auto bad = ranks.groups[0].all_to_all(torch::zeros({4}), out);
  ASSERT_FALSE(bad);
  EXPECT_EQ(code_of(bad.error()), errc::shape_mismatch);
}

TEST(SendRecv, TaggedMessagesArriveAndAreCounted) {
  auto ranks = make_ranks(2, "p2p");
  auto got = on_every_rank<std::vector<torch::Tensor>>(ranks.groups, [&](process_group& g) {
    std::vector<torch::Tensor> received;
    if (g.rank() == 0) {
      expect_ok(g.send(input_of(0, 3, 1), 1, 11));
      expect_ok(g.send(input_of(0, 5, 2), 1, 12));
      auto back = torch::zeros({2}, torch::kLong);
      expect_ok(g.recv(back, 1, 0));
      received.push_back(back);
    } else {
      auto a = torch::zeros({3});
      auto b = torch::zeros({5});
      expect_ok(g.recv(a, 0, 11));
      expect_ok(g.recv(b, 0, 12));
      expect_ok(g.send(torch::tensor({4, 2}, torch::kLong), 0, 0));
      received = {a, b};
    }
    return received;
  });
  EXPECT_TRUE(torch::equal(got[1][0], input_of(0, 3, 1)));
  EXPECT_TRUE(torch::equal(got[1][1], input_of(0, 5, 2)));
  EXPECT_TRUE(torch::equal(got[0][0], torch::tensor({4, 2}, torch::kLong)));
  EXPECT_EQ(ranks.groups[0].traffic().bytes_sent, 8 * 4);
  EXPECT_EQ(ranks.groups[0].traffic().bytes_received, 16);
  EXPECT_EQ(ranks.groups[1].traffic().bytes_received, 8 * 4);

  auto t = torch::zeros({1});
  for (auto [peer, tag] : {std::pair{0, 0}, std::pair{2, 0}, std::pair{1, -1},
                           std::pair{1, process_group::max_user_tag + 1}}) {
    auto bad = ranks.groups[0].send(t, peer, tag);
    ASSERT_FALSE(bad) << peer << " " << tag;
    EXPECT_EQ(code_of(bad.error()), errc::invalid_argument);
  }
}

TEST(RankMesh, CoordinatesAndLines) {
  rank_mesh m{{2, 3, 2}};
  EXPECT_EQ(m.size(), 12);
  EXPECT_EQ(m.coords(0), (std::vector<int>{0, 0, 0}));
  EXPECT_EQ(m.coords(7), (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(m.coords(11), (std::vector<int>{1, 2, 1}));
  EXPECT_EQ(m.line(7, 0), (std::vector<int>{1, 7}));
  EXPECT_EQ(m.line(7, 1), (std::vector<int>{7, 9, 11}));
  EXPECT_EQ(m.line(7, 2), (std::vector<int>{6, 7}));
  // Every rank lies on exactly one line per dimension, and lines partition the mesh.
  for (size_t d = 0; d < 3; ++d) {
    std::vector<int> seen(12, 0);
    for (int r = 0; r < 12; ++r)
      if (m.line(r, d).front() == r)
        for (int x : m.line(r, d))
          ++seen[x];
    EXPECT_EQ(seen, std::vector<int>(12, 1)) << d;
  }
  // A line's index: the same for its ranks, distinct across lines, 0 .. lines − 1.
  EXPECT_EQ(m.line_index(7, 1), 1 * 2 + 1); // {dp 1, tp 1} of 2 × 2 lines along pp
  EXPECT_EQ(m.line_index(7, 0), 0 * 2 + 1);
  EXPECT_EQ(m.line_index(7, 2), 1 * 3 + 0);
  for (size_t d = 0; d < 3; ++d) {
    std::vector<int> first_of(static_cast<size_t>(12 / m.shape[d]), -1);
    for (int r = 0; r < 12; ++r) {
      const auto i = m.line_index(r, d);
      ASSERT_GE(i, 0);
      ASSERT_LT(i, 12 / m.shape[d]);
      auto& f = first_of[static_cast<size_t>(i)];
      if (f < 0)
        f = m.line(r, d).front();
      EXPECT_EQ(f, m.line(r, d).front()) << "rank " << r << " along " << d;
    }
  }
}

TEST(SubGroups, MeshGroupsReduceAlongTheirDimensionOnly) {
  auto ranks = make_ranks(4, "mesh");
  rank_mesh mesh{{2, 2}};
  auto sums = on_every_rank<std::vector<double>>(ranks.groups, [&](process_group& world) {
    auto groups = make_mesh_groups(world, mesh, {"dp", "tp"});
    EXPECT_TRUE(groups) << describe(groups.error());
    std::vector<double> out;
    if (!groups)
      return out;
    for (auto& g : *groups) {
      auto t = torch::full({1}, static_cast<double>(world.rank()), torch::kDouble);
      expect_ok(g.all_reduce(t, reduce_op::sum));
      out.push_back(t.item<double>());
      out.push_back(g.size());
      out.push_back(g.rank());
    }
    return out;
  });
  // Rank r = (dp, tp) = (r / 2, r % 2): its dp line is {tp, tp + 2}, its tp line {2dp, 2dp + 1}.
  for (int r = 0; r < 4; ++r) {
    int dp = r / 2, tp = r % 2;
    std::vector<double> want{double(tp + tp + 2), 2, double(dp), double(4 * dp + 1), 2, double(tp)};
    EXPECT_EQ(sums[r], want) << r;
  }
}

TEST(SubGroups, SplitRefusesBadMembershipAndReusedNames) {
  auto ranks = make_ranks(2, "split");
  auto& g = ranks.groups[0];
  for (auto members :
       {std::vector<int>{1}, std::vector<int>{1, 0}, std::vector<int>{0, 2}, std::vector<int>{}}) {
    auto s = g.split("x", members);
    ASSERT_FALSE(s);
    EXPECT_EQ(code_of(s.error()), errc::invalid_argument);
  }
  auto solo = g.split("solo", {0});
  ASSERT_TRUE(solo) << describe(solo.error());
  EXPECT_EQ(solo->size(), 1);
  auto again = g.split("solo", {0});
  ASSERT_FALSE(again);
  EXPECT_NE(context_of(again.error()).find("already used"), std::string::npos);
  auto bad = make_mesh_groups(g, rank_mesh{{3}}, {"dp"});
  ASSERT_FALSE(bad);
  EXPECT_EQ(code_of(bad.error()), errc::shape_mismatch);
}

namespace {

using clock_type = std::chrono::steady_clock;

struct outcome {
  errc code = errc::none;
  double seconds = 0;
};

/// Three ranks with timeout `timeout_ms`; rank `faulty` runs under `plan`;
/// every rank runs `body` and reports how it ended and when.
std::vector<outcome> run_with_fault(const std::string& name, int64_t timeout_ms, int faulty,
                                    test::fault_plan plan,
                                    const std::function<expected<void>(process_group&)>& body) {
  auto ranks = make_ranks(3, name, timeout_ms);
  ranks.groups[faulty] = test::with_faults(std::move(ranks.groups[faulty]), plan);
  auto start = clock_type::now();
  return on_every_rank<outcome>(ranks.groups, [&](process_group& g) {
    auto r = body(g);
    return outcome{r ? errc::none : code_of(r.error()),
                   std::chrono::duration<double>(clock_type::now() - start).count()};
  });
}

expected<void> one_all_reduce(process_group& g) {
  auto t = torch::ones({16});
  return g.all_reduce(t, reduce_op::sum);
}

} // namespace

TEST(CollectiveFaults, ARankThatNeverArrivesTimesItsPeersOut) {
  test::fault_plan plan;
  plan.what = test::fault_plan::kind::never_arrive;
  auto got = run_with_fault("never", 1500, 2, plan, one_all_reduce);
  EXPECT_EQ(got[2].code, errc::unavailable);
  EXPECT_LT(got[2].seconds, 1.0);
  for (int r : {0, 1}) {
    EXPECT_EQ(got[r].code, errc::timeout) << r;
    EXPECT_GE(got[r].seconds, 1.4) << r;  // they waited their timeout ...
    EXPECT_LT(got[r].seconds, 10.0) << r; // ... and no longer
  }
}

TEST(CollectiveFaults, ARankLaterThanTheTimeoutFailsEveryone) {
  test::fault_plan plan;
  plan.what = test::fault_plan::kind::late;
  plan.late_ms = 1800;
  auto got = run_with_fault("late", 1000, 0, plan, one_all_reduce);
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(got[r].code, errc::none) << r;
    EXPECT_LT(got[r].seconds, 10.0) << r;
  }
  // Late within the timeout is only late.
  plan.late_ms = 100;
  auto fine = run_with_fault("late-ok", 10000, 0, plan, one_all_reduce);
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(fine[r].code, errc::none) << r;
}

TEST(CollectiveFaults, ARankAbortingMidRingFailsItsPeersWithoutAHang) {
  test::fault_plan plan;
  plan.what = test::fault_plan::kind::abort;
  plan.at_operation = 2; // after the first ring step's send and receive
  auto got = run_with_fault("abort", 2000, 1, plan, [](process_group& g) -> expected<void> {
    auto in = torch::ones({3 * 64});
    auto out = torch::zeros({64});
    return g.reduce_scatter(in, out, reduce_op::sum);
  });
  EXPECT_EQ(got[1].code, errc::cancelled);
  for (int r : {0, 2}) {
    EXPECT_TRUE(got[r].code == errc::unavailable || got[r].code == errc::timeout)
        << r << ": " << to_string(got[r].code);
    EXPECT_LT(got[r].seconds, 10.0) << r;
  }
}

// bf16 (mixed-precision gradients and weights): the reductions sum it, the
// data movements copy its bits, whatever the backend's dtype list holds.
TEST(Collectives, Bf16TensorsReduceAndMove) {
  auto ranks = make_ranks(2, "bf16");
  auto bf = [](int rank, int64_t n) { return input_of(rank, n).to(torch::kBFloat16); };
  auto sum = (bf(0, 8).to(torch::kFloat) + bf(1, 8).to(torch::kFloat));
  auto outs = on_every_rank<std::vector<torch::Tensor>>(ranks.groups, [&](process_group& g) {
    auto all = bf(g.rank(), 8);
    expect_ok(g.all_reduce_sum(all));
    auto red = bf(g.rank(), 8);
    expect_ok(g.reduce(red, 1, reduce_op::sum));
    auto root = bf(g.rank(), 8);
    expect_ok(g.broadcast(root, 0));
    auto gathered = torch::empty({16}, torch::kBFloat16);
    expect_ok(g.all_gather(bf(g.rank(), 8), gathered));
    auto scattered = torch::empty({4}, torch::kBFloat16);
    expect_ok(g.reduce_scatter(bf(g.rank(), 8), scattered, reduce_op::sum));
    return std::vector<torch::Tensor>{all, red, root, gathered, scattered};
  });
  for (int r = 0; r < 2; ++r) {
    const auto& o = outs[r];
    for (const auto& t : o)
      EXPECT_EQ(t.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::allclose(o[0].to(torch::kFloat), sum, 1e-2, 1e-2)) << "all_reduce";
    if (r == 1) {
      EXPECT_TRUE(torch::allclose(o[1].to(torch::kFloat), sum, 1e-2, 1e-2)) << "reduce";
    }
    EXPECT_TRUE(torch::equal(o[2], bf(0, 8))) << "broadcast";
    EXPECT_TRUE(torch::equal(o[3], torch::cat({bf(0, 8), bf(1, 8)}))) << "all_gather";
    EXPECT_TRUE(torch::allclose(o[4].to(torch::kFloat), sum.narrow(0, 4 * r, 4), 1e-2, 1e-2))
        << "reduce_scatter";
  }
}
