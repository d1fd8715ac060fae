#include "myriad/train/loss_scaler.h"

#include "myriad/comm/communicator.h"
#include "myriad/util/error.h"

namespace myriad {

DynamicLossScaler::DynamicLossScaler(double initial_scale, int64_t growth_interval)
    : scale_(initial_scale), growth_interval_(growth_interval) {
  MYRIAD_CHECK(initial_scale > 0 && growth_interval > 0,
               "loss scaling needs a positive scale and interval");
}

bool DynamicLossScaler::unscale(const std::vector<torch::Tensor>& params, Communicator& comm) {
  torch::NoGradGuard no_grad;
  torch::Tensor overflow = torch::zeros({1}, torch::dtype(torch::kInt32).device(comm.device()));
  for (const torch::Tensor& p : params) {
    if (!p.grad().defined()) continue;
    torch::Tensor g = p.grad();
    g.mul_(1.0 / scale_);
    overflow.add_(g.isfinite().all().logical_not().to(torch::kInt32));
  }
  // Gradients are already summed over ranks, so every rank sees the same overflow; agreeing
  // explicitly keeps that true whatever happens before this point.
  comm.all_reduce(overflow, ReduceOp::kMax);
  const bool skip = overflow.item<int32_t>() > 0;
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
