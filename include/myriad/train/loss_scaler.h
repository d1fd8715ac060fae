#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace myriad {

class Communicator;

// Dynamic loss scaling for float16 training. The loss is multiplied by scale() before backward;
// unscale() divides the (already summed) gradients back in place and flags, on the device, whether
// any is NaN or infinite on any rank; the optimizer skips the step on that flag, and update()
// then reads it: the scale halves after a skipped step, and doubles after `growth_interval` clean
// steps in a row.
class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(double initial_scale = 65536.0, int64_t growth_interval = 2000);

  double scale() const { return scale_; }
  void set_scale(double scale) { scale_ = scale; }
  int64_t clean_steps() const { return clean_steps_; }
  void set_clean_steps(int64_t steps) { clean_steps_ = steps; }
  // `gradients`: the tensors holding them (GradientSynchronizer::buffers()). Returns the overflow
  // flag, a float [1] on `comm`'s device, the same on every rank (collective over `comm`).
  torch::Tensor unscale(const std::vector<torch::Tensor>& gradients, Communicator& comm) const;
  // After the step: reads the flag (a host synchronisation) and adapts the scale. True when the
  // step was skipped.
  bool update(const torch::Tensor& overflow);

 private:
  double scale_;
  int64_t growth_interval_;
  int64_t clean_steps_ = 0;
};

}  // namespace myriad
