// Shared GoogleTest main: deterministic LibTorch settings for every suite.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <csignal>

int main(int argc, char** argv) {
  // As troupe's executables do (apps/main.cpp): gloo writes to a peer that
  // a test just ended without MSG_NOSIGNAL; that must fail the write, not
  // kill the suite with SIGPIPE.
  std::signal(SIGPIPE, SIG_IGN);
  ::testing::InitGoogleTest(&argc, argv);
  torch::manual_seed(0);
  return RUN_ALL_TESTS();
}
