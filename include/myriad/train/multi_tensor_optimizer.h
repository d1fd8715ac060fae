#pragma once

#include <torch/torch.h>

namespace myriad {

// An optimizer step that a non-finite gradient cancels (float16 loss scaling).
class SkippableStep {
 public:
  // One step, unless `overflow` (a float [1] on the parameters' device, as
  // DynamicLossScaler::unscale returns it) is non-zero; an undefined `overflow` never skips.
  virtual void step_unless(const torch::Tensor& overflow) = 0;

 protected:
  ~SkippableStep() = default;
};

// LibTorch's SGD and AdamW with the same options, the same per-parameter state (so checkpoints
// and find_param_state see no difference) and the same arithmetic, but each step applied to all
// parameters at once: a handful of multi-tensor (_foreach_) launches instead of four to eight
// kernels per parameter. Where LibTorch has ATen's fused SGD kernel (2.4 and later, on GPUs), SGD
// is one pass over parameters, gradients and momentum, and it reads `overflow` on the device, so
// that a float16 step does not wait for the host to learn whether to skip. The step uses the
// gradients as scratch space: they are consumed by it.
class MultiTensorSgd final : public torch::optim::SGD, public SkippableStep {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override;
  void step_unless(const torch::Tensor& overflow) override;
};

class MultiTensorAdamW final : public torch::optim::AdamW, public SkippableStep {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
  void step_unless(const torch::Tensor& overflow) override;
};

}  // namespace myriad
