#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace myriad {

class Communicator;

// Dynamic loss scaling for float16 training, kept on the device so that no step waits for the
// host. The loss is multiplied by scale() before backward; unscale() divides the (already summed)
// gradients back in place and flags, on the device, whether any is NaN or infinite on any rank;
// the optimizer skips the step on that flag, and update() then adapts the scale on the device: it
// halves (not below 1) after a skipped step, and doubles after `growth_interval` clean steps in a
// row. The host reads the state only when it asks for it (checkpoints, logs).
class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(const torch::Device& device, double initial_scale = 65536.0,
                             int64_t growth_interval = 2000);

  // float32 [1] on the device.
  const torch::Tensor& scale() const { return scale_; }
  // 1 / scale(), float32 [1] on the device, updated in place with it: whoever divides the scale
  // out (the classifier's fused update) holds this tensor and reads it there, with no kernel of
  // its own per step.
  const torch::Tensor& inverse_scale() const { return inverse_; }
  // Host copies of the state (each a synchronisation with the device), and their restore.
  double scale_value() const;
  int64_t clean_steps() const;
  void set_state(double scale, int64_t clean_steps);
  // `gradients`: the tensors holding them (GradientSynchronizer::buffers()). Returns the overflow
  // flag, a float [1] on `comm`'s device, the same on every rank (collective over `comm`).
  torch::Tensor unscale(const std::vector<torch::Tensor>& gradients, Communicator& comm) const;
  // After the step, on the device.
  void update(const torch::Tensor& overflow);
  // The scale, and the steps skipped since the last call, in one synchronisation (for the
  // progress log).
  struct Report {
    double scale = 0.0;
    int64_t skipped_steps = 0;
  };
  Report take_report();

 private:
  torch::Tensor scale_;    // float32 [1]
  torch::Tensor inverse_;  // float32 [1]: 1 / scale_
  torch::Tensor clean_;    // int64 [1]: clean steps in a row
  torch::Tensor skipped_;  // int64 [1]: skipped steps not yet reported
  int64_t growth_interval_;
};

}  // namespace myriad
