#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/optimizer_check.h"

namespace myriad::testing {
namespace {

// The CPU path (multi-tensor kernels); tests/mpi/training_test.cpp runs the same on GPUs, where
// SGD takes ATen's fused kernel.
TEST(MultiTensorOptimizer, MatchesLibTorchOptimizers) {
  expect_multi_tensor_optimizers_match(torch::kCPU);
}

}  // namespace
}  // namespace myriad::testing
