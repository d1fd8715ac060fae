#pragma once

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace myriad {

class Communicator;

// Dynamic loss scaling for float16 training. The loss is multiplied by scale() before backward;
// unscale() divides the (already summed) gradients back, and reports whether any is NaN or
// infinite on any rank, in which case every rank skips the step and the scale halves. After
// `growth_interval` clean steps in a row the scale doubles.
class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(double initial_scale = 65536.0, int64_t growth_interval = 2000);

  double scale() const { return scale_; }
  void set_scale(double scale) { scale_ = scale; }
  int64_t clean_steps() const { return clean_steps_; }
  void set_clean_steps(int64_t steps) { clean_steps_ = steps; }
  // Returns true when the step must be skipped; collective over `comm`'s ranks.
  bool unscale(const std::vector<torch::Tensor>& params, Communicator& comm);

 private:
  double scale_;
  int64_t growth_interval_;
  int64_t clean_steps_ = 0;
};

}  // namespace myriad
