#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <type_traits>
#include <vector>

#include "myriad/optim/multi_tensor_optimizer.h"
#include "myriad/optim/optimizer_state.h"

namespace myriad::testing {

// Parameters of several shapes on `device`, one of them stored channels-last as a backbone's are
// on GPUs.
inline std::vector<torch::Tensor> optimizer_test_params(uint64_t seed,
                                                        const torch::Device& device) {
  torch::manual_seed(seed);
  std::vector<torch::Tensor> params = {
      torch::randn({8, 3, 3, 3}).contiguous(torch::MemoryFormat::ChannelsLast), torch::randn({16}),
      torch::randn({5, 7}), torch::randn({1})};
  for (torch::Tensor& p : params) p = p.to(device).requires_grad_(true);
  return params;
}

// `steps` steps of LibTorch's own optimizer (`Reference`, on the CPU) against `Ours` on `device`,
// over identical parameters and gradients. With `gaps`, the last parameter gets no gradient on odd
// steps; on step `skipped` (if any) `Ours` is told that the gradients overflowed, and LibTorch
// takes no step.
template <class Reference, class Ours, class Options>
void expect_same_steps(const Options& options, int steps, const torch::Device& device,
                       int skipped = -1, bool gaps = true) {
  std::vector<torch::Tensor> a = optimizer_test_params(1, torch::kCPU);
  std::vector<torch::Tensor> b = optimizer_test_params(1, device);
  Reference reference(a, options);
  Ours ours(b, options);
  const auto flag = torch::dtype(torch::kFloat32).device(device);
  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(100 + step);
    for (size_t k = 0; k < a.size(); ++k) {
      const bool none = gaps && k + 1 == a.size() && step % 2 == 1;
      const torch::Tensor g = torch::randn(a[k].sizes());
      a[k].mutable_grad() = none ? torch::Tensor() : g.clone();
      b[k].mutable_grad() =
          none ? torch::Tensor() : g.to(device).contiguous(b[k].suggest_memory_format());
    }
    if (step != skipped) reference.step();
    ours.step_unless(step == skipped ? torch::ones({1}, flag) : torch::zeros({1}, flag));
    for (size_t k = 0; k < a.size(); ++k) {
      EXPECT_TRUE(torch::allclose(a[k], b[k].cpu(), 1e-5, 1e-6))
          << "step " << step << " parameter " << k << ": "
          << (a[k] - b[k].cpu()).abs().max().item<double>();
    }
  }
  // The state is LibTorch's own, so checkpoints read and write it unchanged; AdamW's step counts
  // too, once the steps the device skipped are settled.
  ours.settle();
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(find_param_state(reference, a[k]) == nullptr,
              find_param_state(ours, b[k]) == nullptr);
    if constexpr (std::is_same_v<Reference, torch::optim::AdamW>) {
      const auto* want = find_param_state(reference, a[k]);
      const auto* got = find_param_state(ours, b[k]);
      if (want != nullptr && got != nullptr) {
        EXPECT_EQ(static_cast<const torch::optim::AdamWParamState*>(got)->step(),
                  static_cast<const torch::optim::AdamWParamState*>(want)->step())
            << "parameter " << k;
      }
    }
  }
  EXPECT_TRUE(b[0].is_contiguous(torch::MemoryFormat::ChannelsLast));
}

// Momentum restored from a checkpoint, in the default layout while its parameter is channels-last
// (as a loader that ignored the layout would give it): the step reads it all the same.
inline void expect_sgd_uses_restored_state(const torch::Device& device) {
  std::vector<torch::Tensor> a = optimizer_test_params(2, torch::kCPU);
  std::vector<torch::Tensor> b = optimizer_test_params(2, device);
  const auto options = torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3);
  torch::optim::SGD reference(a, options);
  MultiTensorSgd ours(b, options);
  const auto restore = [](torch::optim::Optimizer& optimizer, const torch::Tensor& p,
                          const torch::Tensor& buffer) {
    auto state = std::make_unique<torch::optim::SGDParamState>();
    // A copy each: the optimizers update their buffers in place.
    state->momentum_buffer(
        buffer.to(p.device(), /*non_blocking=*/false, /*copy=*/true).contiguous());
    set_param_state(optimizer, p, std::move(state));
  };
  for (size_t k = 0; k < a.size(); ++k) {
    const torch::Tensor buffer = torch::randn(a[k].sizes());
    restore(reference, a[k], buffer);
    restore(ours, b[k], buffer);
    const torch::Tensor g = torch::randn(a[k].sizes());
    a[k].mutable_grad() = g.clone();
    b[k].mutable_grad() = g.to(device);
  }
  reference.step();
  ours.step();
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_TRUE(torch::allclose(a[k], b[k].cpu(), 1e-5, 1e-6)) << "parameter " << k;
  }
}

// Every optimizer configuration myriad-train can build, on `device`.
inline void expect_multi_tensor_optimizers_match(const torch::Device& device) {
  using torch::optim::AdamWOptions;
  using torch::optim::SGDOptions;
  {
    SCOPED_TRACE("SGD, momentum, weight decay, a skipped step");
    expect_same_steps<torch::optim::SGD, MultiTensorSgd>(
        SGDOptions(0.1).momentum(0.9).weight_decay(5e-4), 5, device, 2);
  }
  {
    SCOPED_TRACE("SGD, the first step skipped");
    expect_same_steps<torch::optim::SGD, MultiTensorSgd>(SGDOptions(0.1).momentum(0.9), 3, device,
                                                         0);
  }
  {
    SCOPED_TRACE("SGD, Nesterov");
    expect_same_steps<torch::optim::SGD, MultiTensorSgd>(
        SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(1e-3), 4, device);
  }
  {
    SCOPED_TRACE("SGD, dampening");
    expect_same_steps<torch::optim::SGD, MultiTensorSgd>(
        SGDOptions(0.05).momentum(0.5).dampening(0.1), 4, device);
  }
  {
    SCOPED_TRACE("SGD, no momentum");
    expect_same_steps<torch::optim::SGD, MultiTensorSgd>(SGDOptions(0.2), 3, device, 1);
  }
  {
    SCOPED_TRACE("AdamW");
    expect_same_steps<torch::optim::AdamW, MultiTensorAdamW>(AdamWOptions(1e-2).weight_decay(0.1),
                                                             6, device, 3);
  }
  {
    // The trainer's case: every parameter has a gradient at every step (buckets), so skips are
    // counted on the device until the state is read.
    SCOPED_TRACE("AdamW, no gaps, a skipped step");
    expect_same_steps<torch::optim::AdamW, MultiTensorAdamW>(AdamWOptions(1e-2).weight_decay(0.1),
                                                             6, device, 2, /*gaps=*/false);
  }
  {
    SCOPED_TRACE("AdamW, other betas and eps");
    expect_same_steps<torch::optim::AdamW, MultiTensorAdamW>(
        AdamWOptions(3e-3).betas({0.8, 0.99}).eps(1e-6).weight_decay(0), 4, device);
  }
  {
    SCOPED_TRACE("SGD, momentum restored in the default layout");
    expect_sgd_uses_restored_state(device);
  }
}

}  // namespace myriad::testing
