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

// The momentum buffer it reads on resume is the one it writes.
TEST(MultiTensorOptimizer, SgdUsesRestoredState) {
  std::vector<torch::Tensor> a = optimizer_test_params(2, torch::kCPU);
  std::vector<torch::Tensor> b = optimizer_test_params(2, torch::kCPU);
  const auto options = torch::optim::SGDOptions(0.1).momentum(0.9);
  torch::optim::SGD reference(a, options);
  MultiTensorSgd ours(b, options);
  const auto restore = [](torch::optim::Optimizer& optimizer, const torch::Tensor& p,
                          const torch::Tensor& buffer) {
    auto state = std::make_unique<torch::optim::SGDParamState>();
    state->momentum_buffer(buffer.clone());
    set_param_state(optimizer, p, std::move(state));
  };
  for (size_t k = 0; k < a.size(); ++k) {
    const torch::Tensor buffer = torch::randn(a[k].sizes());
    restore(reference, a[k], buffer);
    restore(ours, b[k], buffer);
    a[k].mutable_grad() = torch::ones(a[k].sizes());
    b[k].mutable_grad() = torch::ones(b[k].sizes());
  }
  reference.step();
  ours.step();
  for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(torch::allclose(a[k], b[k], 1e-6, 1e-7)) << k;
}

}  // namespace
}  // namespace myriad::testing
