// NOTE [counting allocator]: storages count under the tag of the thread
// that allocated them, current and peak, and uncount under it whoever frees
// them.
#include "runtime/counting_allocator.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

using troupe::runtime::counting_allocator;

TEST(CountingAllocator, CountsEachTagsStoragesCurrentAndPeak) {
  auto& counter = counting_allocator::install();
  EXPECT_EQ(&counter, &counting_allocator::install());
  const auto before = counter.counts(5);
  counting_allocator::set_thread_tag(5);
  auto a = torch::empty({1000}, torch::kFloat32); // 4000 bytes
  torch::Tensor b;
  std::thread other([&] {
    counting_allocator::set_thread_tag(6);
    b = torch::empty({500}, torch::kFloat64); // 4000 bytes, counted under 6
  });
  other.join();
  counting_allocator::set_thread_tag(-1);
  EXPECT_EQ(counter.counts(5).current - before.current, 4000);
  EXPECT_EQ(counter.counts(6).current, 4000);
  counter.reset_peak(5);
  {
    counting_allocator::set_thread_tag(5);
    auto c = torch::ones({2000}, torch::kFloat32); // 8000 more, for a while
    counting_allocator::set_thread_tag(-1);
    EXPECT_EQ(counter.counts(5).current - before.current, 12000);
  }
  EXPECT_EQ(counter.counts(5).current - before.current, 4000);
  EXPECT_EQ(counter.counts(5).peak - before.current, 12000);
  b = torch::Tensor(); // freed by this thread (untagged): uncounted under 6
  EXPECT_EQ(counter.counts(6).current, 0);
  EXPECT_EQ(counter.counts(6).peak, 4000);
}
