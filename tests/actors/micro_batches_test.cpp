// NOTE [token micro-batches]: packing rows by length under a token budget,
// and cutting a right-padded batch to a micro-batch's longest row.
#include "actors/rl/data.hpp"
#include "actors/train/micro_batches.hpp"

#include <gtest/gtest.h>
#include <torch/torch.h>

using namespace troupe;
using actors::train::pack_by_tokens;

TEST(TokenMicroBatches, RowsGoLongestFirstWhileRowsTimesTheLongestFit) {
  // Sorted: 9 (row 2), 7 (4), 5 (0), 3 (1), 2 (3). Budget 14: [9] alone
  // (2 x 9 > 14), [7, 5] (2 x 7 = 14), [3, 2].
  using rows = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(pack_by_tokens({5, 3, 9, 2, 7}, 14), (rows{{2}, {4, 0}, {1, 3}}));
  // A row longer than the budget is a micro-batch of its own.
  EXPECT_EQ(pack_by_tokens({9, 2}, 4), (rows{{0}, {1}}));
  // Room for all: one micro-batch.
  EXPECT_EQ(pack_by_tokens({3, 3, 2}, 100), (rows{{0, 1, 2}}));
  for (const auto& mb : pack_by_tokens({5, 3, 9, 2, 7, 4, 4, 6}, 12)) {
    int64_t longest = 0;
    for (auto r : mb)
      longest =
          std::max(longest, std::vector<int64_t>{5, 3, 9, 2, 7, 4, 4, 6}[static_cast<size_t>(r)]);
    EXPECT_TRUE(mb.size() == 1 || static_cast<int64_t>(mb.size()) * longest <= 12);
  }
}

TEST(TokenMicroBatches, AMicroBatchIsCutToItsLongestRowAndItsOutputsPaddedBack) {
  auto b = actors::rl::collate_sequences({{1, 2, 3}, {4}, {5, 6}}, {{7, 8}, {9}, {10}}, 0);
  ASSERT_TRUE(b) << describe(b.error());
  ASSERT_TRUE(b->set("old_log_probs", torch::arange(12, torch::kFloat).view({3, 4})));
  auto lengths = actors::train::row_lengths(*b);
  ASSERT_TRUE(lengths);
  EXPECT_EQ(*lengths, (std::vector<int64_t>{5, 2, 3}));
  auto width = actors::train::batch_width(*b);
  ASSERT_TRUE(width);
  EXPECT_EQ(*width, 5);
  auto mb = actors::train::take_rows(*b, {2, 1}, 3);
  ASSERT_TRUE(mb) << describe(mb.error());
  EXPECT_EQ(mb->size(), 2);
  EXPECT_TRUE(torch::equal(mb->get("input_ids").value(),
                           torch::tensor({5, 6, 10, 4, 9, 0}, torch::kLong).view({2, 3})));
  EXPECT_EQ(mb->get("response_mask").value().sizes(), (std::vector<int64_t>{2, 2}));
  EXPECT_TRUE(torch::equal(mb->get("old_log_probs").value(),
                           torch::tensor({8.0f, 9.0f, 4.0f, 5.0f}).view({2, 2})));
  runtime::tensor_batch out;
  ASSERT_TRUE(out.set("log_probs", torch::ones({2, 2})));
  ASSERT_TRUE(out.set("scores", torch::ones({2})));
  auto padded = actors::train::pad_outputs(out, 3, 5);
  ASSERT_TRUE(padded);
  EXPECT_TRUE(
      torch::equal(padded->get("log_probs").value(),
                   torch::tensor({1.0f, 1.0f, 0.0f, 0.0f, 1.0f, 1.0f, 0.0f, 0.0f}).view({2, 4})));
  EXPECT_EQ(padded->get("scores").value().sizes(), (std::vector<int64_t>{2}));
}

TEST(TokenMicroBatches, ABatchWithoutIdsIsAClearError) {
  runtime::tensor_batch b;
  ASSERT_TRUE(b.set("values", torch::ones({2, 3})));
  auto w = actors::train::batch_width(b);
  ASSERT_FALSE(w);
  EXPECT_NE(describe(w.error()).find("micro_batch_tokens"), std::string::npos);
}
