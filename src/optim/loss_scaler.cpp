#include "myriad/optim/loss_scaler.h"

#include "myriad/comm/communicator.h"
#include "myriad/util/error.h"

namespace myriad {

DynamicLossScaler::DynamicLossScaler(const torch::Device& device, double initial_scale,
                                     int64_t growth_interval)
    : scale_(torch::full({1}, initial_scale, torch::dtype(torch::kFloat32).device(device))),
      inverse_(scale_.reciprocal()),
      clean_(torch::zeros({1}, torch::dtype(torch::kInt64).device(device))),
      skipped_(torch::zeros_like(clean_)),
      growth_interval_(growth_interval) {
  MYRIAD_CHECK(initial_scale > 0 && growth_interval > 0,
               "loss scaling needs a positive scale and interval");
}

double DynamicLossScaler::scale_value() const {
  return scale_.item<double>();
}

int64_t DynamicLossScaler::clean_steps() const {
  return clean_.item<int64_t>();
}

void DynamicLossScaler::set_state(double scale, int64_t clean_steps) {
  MYRIAD_CHECK(scale > 0 && clean_steps >= 0, "a loss scale of {} after {} clean steps", scale,
               clean_steps);
  scale_.fill_(scale);
  inverse_.fill_(1.0 / scale);
  clean_.fill_(clean_steps);
}

torch::Tensor DynamicLossScaler::unscale(const std::vector<torch::Tensor>& gradients,
                                         Communicator& comm) const {
  torch::NoGradGuard no_grad;
  torch::Tensor overflow = torch::zeros({1}, scale_.options());
  if (comm.device().is_cuda()) {
    // One fused pass over all tensors: divide, and flag any NaN or infinity.
    torch::_amp_foreach_non_finite_check_and_unscale_(gradients, overflow, inverse_);
  } else {
    // LibTorch 1.13 has no CPU kernel of the fused pass.
    for (const torch::Tensor& g : gradients) {
      g.mul_(inverse_);
      overflow.add_(g.isfinite().all().logical_not());
    }
  }
  // Gradients are already summed over ranks, so every rank sees the same overflow; agreeing
  // explicitly keeps that true whatever happens before this point.
  comm.all_reduce(overflow, ReduceOp::kMax);
  return overflow;
}

void DynamicLossScaler::update(const torch::Tensor& overflow) {
  torch::NoGradGuard no_grad;
  const torch::Tensor skipped = overflow.gt(0);
  clean_.add_(1).masked_fill_(skipped, 0);
  const torch::Tensor grow = clean_.ge(growth_interval_);
  scale_.copy_(torch::where(skipped, (scale_ * 0.5).clamp_min_(1.0),
                            torch::where(grow, scale_ * 2.0, scale_)));
  clean_.masked_fill_(grow, 0);
  at::reciprocal_out(inverse_, scale_);
  skipped_.add_(skipped);
}

DynamicLossScaler::Report DynamicLossScaler::take_report() {
  const torch::Tensor both =
      torch::stack({scale_.to(torch::kFloat64), skipped_.to(torch::kFloat64)}).cpu();
  skipped_.zero_();
  return {both[0].item<double>(), static_cast<int64_t>(both[1].item<double>())};
}

}  // namespace myriad
