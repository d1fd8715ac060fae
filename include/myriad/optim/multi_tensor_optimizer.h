#pragma once

#include <torch/torch.h>

namespace myriad {

// An optimizer step that a non-finite gradient cancels (float16 loss scaling).
class SkippableStep {
 public:
  // One step, unless `overflow` (a float [1] on the parameters' device, as
  // DynamicLossScaler::unscale returns it) is non-zero; an undefined `overflow` never skips.
  virtual void step_unless(const torch::Tensor& overflow) = 0;
  // Brings what the host keeps of the state (AdamW's step counts) up to date with the steps the
  // device skipped: a synchronisation, for whoever reads the state (checkpoints).
  virtual void settle() {}

 protected:
  ~SkippableStep() = default;
};

// LibTorch's SGD and AdamW with the same options, the same per-parameter state (so checkpoints
// and find_param_state see no difference) and the same arithmetic, but each step applied to all
// parameters at once: a handful of multi-tensor (_foreach_) launches instead of four to eight
// kernels per parameter. Where LibTorch has ATen's fused SGD and AdamW kernels (2.4 and later, on
// GPUs), a step is one pass over parameters, gradients and state, and it reads `overflow` on the
// device, so that a float16 step does not wait for the host to learn whether to skip. The step
// uses the gradients as scratch space: they are consumed by it.
class MultiTensorSgd final : public torch::optim::SGD, public SkippableStep {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override;
  void step_unless(const torch::Tensor& overflow) override;
};

// With the fused kernel, the host counts every step in the state's step() and the device counts
// the ones it skipped; settle() takes those back (checkpoints read the state through
// named_param_states, which settles first).
class MultiTensorAdamW final : public torch::optim::AdamW, public SkippableStep {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
  void step_unless(const torch::Tensor& overflow) override;
  void settle() override;

 private:
  // ATen's fused kernel, on GPUs: false where it does not apply (the CPU, older LibTorch).
  bool fused_step(const torch::Tensor& overflow);

  torch::Tensor skipped_;              // float32 [1] on the device: skipped since settle()
  std::vector<torch::Tensor> window_;  // the parameters stepped since settle()
};

}  // namespace myriad
