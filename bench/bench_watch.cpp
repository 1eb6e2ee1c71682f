// The cost of watching collective calls (NOTE [calls in flight]): every
// blocking process_group call registers itself in a process-wide table
// while it runs, so the heartbeats can report deadlocked collectives.
//   table      one registration and its removal, ns;
//   all_reduce two gloo ranks in this process, watched (their group has an
//              identity) against the same ranks unwatched (a wrapper that
//              answers identity 0), rounds interleaved, for a 1-element,
//              a 4 KiB and a 1 MiB tensor.
// Usage: bench_watch [CALLS=2000] [ROUNDS=5]. Medians over ROUNDS.
#include "runtime/collectives.hpp"
#include "runtime/hooked_backend.hpp"
#include "runtime/inflight.hpp"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <vector>

using namespace troupe;
using namespace troupe::runtime;

namespace {

using clock_type = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The group it wraps, with no identity: its calls are not listed.
class unwatched_backend final : public hooked_backend {
public:
  using hooked_backend::hooked_backend;
  uint64_t identity() const override { return 0; }

private:
  expected<void> before(int, const char*) override { return {}; }
};

// Seconds per all-reduce of `numel` floats, both ranks at once.
double per_call(std::vector<process_group>& ranks, int64_t numel, int calls) {
  auto run = [&](process_group& g) {
    auto t = torch::ones({numel});
    for (int i = 0; i < calls; ++i)
      if (!g.all_reduce(t, reduce_op::sum)) {
        std::fprintf(stderr, "all_reduce failed\n");
        std::exit(1);
      }
  };
  const auto t0 = clock_type::now();
  auto other = std::async(std::launch::async, [&] { run(ranks[1]); });
  run(ranks[0]);
  other.get();
  return std::chrono::duration<double>(clock_type::now() - t0).count() / calls;
}

local_groups two_ranks(const std::string& name) {
  group_options go;
  go.name = name;
  auto g = make_local_groups(2, go);
  if (!g) {
    std::fprintf(stderr, "%s\n", describe(g.error()).c_str());
    std::exit(1);
  }
  return std::move(*g);
}

} // namespace

int main(int argc, char** argv) {
  const int calls = argc > 1 ? std::atoi(argv[1]) : 2000;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  if (calls < 1 || rounds < 1) {
    std::fprintf(stderr, "usage: bench_watch [CALLS >= 1] [ROUNDS >= 1]\n");
    return 2;
  }
  torch::set_num_threads(1);

  std::vector<double> table;
  for (int r = 0; r < rounds; ++r) {
    const int n = 1'000'000;
    const auto t0 = clock_type::now();
    for (int i = 0; i < n; ++i)
      const scoped_call c{0x1234, 0, 2, collective_op::all_reduce};
    table.push_back(std::chrono::duration<double, std::nano>(clock_type::now() - t0).count() / n);
  }
  std::printf("table: %.1f ns per registered call (median of %d rounds of 1M)\n", median(table),
              rounds);

  auto watched = two_ranks("watched");
  auto plain = two_ranks("unwatched");
  std::vector<process_group> unwatched;
  for (auto& g : plain.groups)
    unwatched.emplace_back(std::make_unique<unwatched_backend>(std::move(g).release_backend()));
  std::printf("%-10s %14s %14s %8s\n", "elements", "watched us", "unwatched us", "ratio");
  for (const int64_t numel : {int64_t{1}, int64_t{1024}, int64_t{262144}}) {
    std::vector<double> w, u;
    const int n = numel > 1024 ? std::max(1, calls / 10) : calls;
    per_call(watched.groups, numel, std::max(1, n / 10)); // warm-up
    per_call(unwatched, numel, std::max(1, n / 10));
    for (int r = 0; r < rounds; ++r) {
      w.push_back(per_call(watched.groups, numel, n));
      u.push_back(per_call(unwatched, numel, n));
    }
    std::printf("%-10lld %14.2f %14.2f %7.3fx\n", static_cast<long long>(numel), median(w) * 1e6,
                median(u) * 1e6, median(w) / median(u));
  }
  return 0;
}
