#include "myriad/train/loss_scaler.h"

#include "myriad/comm/communicator.h"
#include "myriad/util/error.h"

namespace myriad {

DynamicLossScaler::DynamicLossScaler(double initial_scale, int64_t growth_interval)
    : scale_(initial_scale), growth_interval_(growth_interval) {
  MYRIAD_CHECK(initial_scale > 0 && growth_interval > 0,
               "loss scaling needs a positive scale and interval");
}

torch::Tensor DynamicLossScaler::unscale(const std::vector<torch::Tensor>& gradients,
                                         Communicator& comm) const {
  torch::NoGradGuard no_grad;
  const auto on_device = torch::dtype(torch::kFloat32).device(comm.device());
  torch::Tensor overflow = torch::zeros({1}, on_device);
  if (comm.device().is_cuda()) {
    // One fused pass over all tensors: divide, and flag any NaN or infinity.
    torch::_amp_foreach_non_finite_check_and_unscale_(gradients, overflow,
                                                      torch::full({1}, 1.0 / scale_, on_device));
  } else {
    // LibTorch 1.13 has no CPU kernel of the fused pass.
    for (const torch::Tensor& g : gradients) {
      g.mul_(1.0 / scale_);
      overflow.add_(g.isfinite().all().logical_not());
    }
  }
  // Gradients are already summed over ranks, so every rank sees the same overflow; agreeing
  // explicitly keeps that true whatever happens before this point.
  comm.all_reduce(overflow, ReduceOp::kMax);
  return overflow;
}

bool DynamicLossScaler::update(const torch::Tensor& overflow) {
  const bool skip = overflow.item<float>() > 0;
  if (skip) {
    scale_ = std::max(1.0, scale_ * 0.5);
    clean_steps_ = 0;
  } else if (++clean_steps_ >= growth_interval_) {
    scale_ *= 2.0;
    clean_steps_ = 0;
  }
  return skip;
}

}  // namespace myriad
