// Shared GoogleTest main: deterministic LibTorch settings for every suite.
#include <gtest/gtest.h>
#include <torch/torch.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  torch::manual_seed(0);
  return RUN_ALL_TESTS();
}
