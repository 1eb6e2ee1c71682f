#include "actors/inference/block_allocator.hpp"

#include <gtest/gtest.h>

#include <vector>

using namespace troupe;
using troupe::actors::inference::block_allocator;

TEST(BlockAllocator, FreshPoolIsEmptyAndHandsOutLowIdsFirst) {
  block_allocator a{4, 16};
  EXPECT_EQ(a.num_blocks(), 4);
  EXPECT_EQ(a.block_size(), 16);
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_EQ(a.num_used(), 0);
  EXPECT_EQ(a.utilization(), 0.0);
  auto b0 = a.allocate();
  auto b1 = a.allocate();
  ASSERT_TRUE(b0 && b1);
  EXPECT_EQ(*b0, 0);
  EXPECT_EQ(*b1, 1);
  EXPECT_EQ(a.ref_count(0), 1);
  EXPECT_EQ(a.ref_count(2), 0);
  EXPECT_EQ(a.num_free(), 2);
  EXPECT_EQ(a.num_used(), 2);
  EXPECT_EQ(a.utilization(), 0.5);
  EXPECT_TRUE(a.check_invariants());
}

TEST(BlockAllocator, RefCountsAndRelease) {
  block_allocator a{3, 4};
  auto b = a.allocate();
  ASSERT_TRUE(b);
  EXPECT_FALSE(a.is_shared(*b));
  ASSERT_TRUE(a.retain(*b));
  ASSERT_TRUE(a.retain(*b));
  EXPECT_EQ(a.ref_count(*b), 3);
  EXPECT_TRUE(a.is_shared(*b));
  ASSERT_TRUE(a.release(*b));
  ASSERT_TRUE(a.release(*b));
  EXPECT_EQ(a.ref_count(*b), 1);
  EXPECT_FALSE(a.is_shared(*b));
  EXPECT_EQ(a.num_free(), 2);
  ASSERT_TRUE(a.release(*b));
  EXPECT_EQ(a.ref_count(*b), 0);
  EXPECT_EQ(a.num_free(), 3);
  // The most recently freed block is reused first.
  auto again = a.allocate();
  ASSERT_TRUE(again);
  EXPECT_EQ(*again, *b);
  EXPECT_TRUE(a.check_invariants());
}

TEST(BlockAllocator, DoubleReleaseAndBadIdsAreErrors) {
  block_allocator a{2, 4};
  auto b = a.allocate();
  ASSERT_TRUE(b);
  ASSERT_TRUE(a.release(*b));
  auto twice = a.release(*b);
  ASSERT_FALSE(twice);
  EXPECT_EQ(code_of(twice.error()), errc::invalid_argument);
  EXPECT_EQ(context_of(twice.error()),
            "kv cache release: kv block 0 is already free (double release)");
  auto resurrect = a.retain(*b);
  ASSERT_FALSE(resurrect);
  EXPECT_EQ(code_of(resurrect.error()), errc::invalid_argument);
  auto out = a.release(2);
  ASSERT_FALSE(out);
  EXPECT_EQ(code_of(out.error()), errc::invalid_argument);
  EXPECT_EQ(context_of(out.error()), "kv cache release: kv block 2 outside [0, 2)");
  EXPECT_EQ(code_of(a.retain(-1).error()), errc::invalid_argument);
  EXPECT_EQ(a.ref_count(7), 0);
  EXPECT_EQ(a.num_free(), 2);
  EXPECT_TRUE(a.check_invariants());
}

TEST(BlockAllocator, ExhaustionIsUnavailable) {
  block_allocator a{2, 4};
  ASSERT_TRUE(a.allocate());
  ASSERT_TRUE(a.allocate());
  auto none = a.allocate();
  ASSERT_FALSE(none);
  EXPECT_EQ(code_of(none.error()), errc::unavailable);
  EXPECT_EQ(context_of(none.error()), "kv cache: no free block (all 2 blocks in use)");
  EXPECT_EQ(a.utilization(), 1.0);
}

TEST(BlockAllocator, BatchAllocateIsAllOrNothing) {
  block_allocator a{5, 4};
  auto three = a.allocate(3);
  ASSERT_TRUE(three);
  EXPECT_EQ(*three, (std::vector<int32_t>{0, 1, 2}));
  auto too_many = a.allocate(3);
  ASSERT_FALSE(too_many);
  EXPECT_EQ(code_of(too_many.error()), errc::unavailable);
  EXPECT_EQ(context_of(too_many.error()), "kv cache: need 3 free blocks, 2 of 5 free");
  EXPECT_EQ(a.num_free(), 2); // nothing taken
  auto none = a.allocate(0);
  ASSERT_TRUE(none);
  EXPECT_TRUE(none->empty());
  EXPECT_EQ(code_of(a.allocate(-1).error()), errc::invalid_argument);
  auto two = a.allocate(2);
  ASSERT_TRUE(two);
  EXPECT_EQ(*two, (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(a.num_free(), 0);
  EXPECT_TRUE(a.check_invariants());
}

TEST(BlockAllocator, ReleaseAllIsAllOrNothing) {
  block_allocator a{4, 4};
  auto ids = a.allocate(3);
  ASSERT_TRUE(ids);
  ASSERT_TRUE(a.retain(1));
  // Block 0 listed twice but owned once: nothing is released.
  std::vector<int32_t> bad{1, 0, 0};
  auto err = a.release_all(bad);
  ASSERT_FALSE(err);
  EXPECT_EQ(code_of(err.error()), errc::invalid_argument);
  EXPECT_EQ(context_of(err.error()),
            "kv cache release: kv block 0 released 2 times but has 1 owners");
  EXPECT_EQ(a.ref_count(0), 1);
  EXPECT_EQ(a.ref_count(1), 2);
  std::vector<int32_t> good{1, 1, 0, 2};
  ASSERT_TRUE(a.release_all(good));
  EXPECT_EQ(a.num_free(), 4);
  EXPECT_TRUE(a.check_invariants());
}

TEST(BlockAllocator, BlocksForRoundsUp) {
  block_allocator a{1, 4};
  EXPECT_EQ(a.blocks_for(0), 0);
  EXPECT_EQ(a.blocks_for(1), 1);
  EXPECT_EQ(a.blocks_for(4), 1);
  EXPECT_EQ(a.blocks_for(5), 2);
  EXPECT_EQ(a.blocks_for(-3), 0);
}

TEST(BlockAllocator, MakeValidates) {
  auto ok = block_allocator::make(8, 16);
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->num_free(), 8);
  auto bad_size = block_allocator::make(8, 0);
  ASSERT_FALSE(bad_size);
  EXPECT_EQ(code_of(bad_size.error()), errc::invalid_argument);
  EXPECT_EQ(context_of(bad_size.error()), "kv cache block_size: expected an integer >= 1, got 0");
  auto bad_count = block_allocator::make(-1, 16);
  ASSERT_FALSE(bad_count);
  EXPECT_EQ(code_of(bad_count.error()), errc::invalid_argument);
  auto empty = block_allocator::make(0, 16);
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->utilization(), 0.0);
  EXPECT_EQ(code_of(empty->allocate().error()), errc::unavailable);
}
