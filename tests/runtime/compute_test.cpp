// Compute threads: the process's count, and one thread's own (a rollout
// rank sharing the cores with its TP peers: NOTE [rollout group]).
#include "runtime/compute.hpp"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <thread>

using namespace troupe;

TEST(ComputeThreads, AThreadsOwnCountLeavesTheOthersAndLaterThreadsAlone) {
  ASSERT_EQ(runtime::set_compute_threads(3), 3);
  int own = 0, after_own = 0, later = 0;
  std::thread([&] {
    own = runtime::set_thread_compute_threads(1);
    at::parallel_for(0, 64, 1, [](int64_t, int64_t) {}); // ATen's first use on this thread
    after_own = at::get_num_threads();
  }).join();
  std::thread([&] { later = at::get_num_threads(); }).join();
  EXPECT_EQ(own, 1);
  EXPECT_EQ(after_own, 1);
  EXPECT_EQ(at::get_num_threads(), 3);
  EXPECT_EQ(later, 3);
  runtime::set_compute_threads(0);
}
