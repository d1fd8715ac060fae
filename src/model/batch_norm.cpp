#include "myriad/model/batch_norm.h"

#include <torch/autograd.h>

#include "myriad/comm/communicator.h"
#include "myriad/model/backbone.h"

namespace myriad {

namespace {

// [N, C, *] -> per-channel reductions over every dim but 1.
std::vector<int64_t> reduced_dims(const torch::Tensor& x) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < x.dim(); ++d) dims.push_back(d);
  return dims;
}

torch::Tensor per_channel(const torch::Tensor& v, const torch::Tensor& like) {
  std::vector<int64_t> shape(like.dim(), 1);
  shape[1] = v.size(0);
  return v.view(shape);
}

// Batch norm with statistics of the global batch. Forward all-reduces [sum, sum of squares,
// count]; backward all-reduces [sum dy, sum dy * x_hat], which the gradient of global statistics
// needs.
class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               BatchNormImpl* module, double eps, double momentum) {
    const torch::Tensor xf = x.to(torch::kFloat32);
    const std::vector<int64_t> dims = reduced_dims(x);
    const int64_t channels = x.size(1);
    const double local_count = static_cast<double>(x.numel() / std::max<int64_t>(1, channels));
    torch::Tensor stats = torch::cat(
        {xf.sum(dims), xf.square().sum(dims), torch::full({1}, local_count, xf.options())});
    module->sync->all_reduce(stats, ReduceOp::kSum);
    // The global count stays on the device: no host synchronisation per layer.
    const torch::Tensor count = stats.narrow(0, 2 * channels, 1);
    const torch::Tensor mean = stats.narrow(0, 0, channels) / count;
    const torch::Tensor var =
        (stats.narrow(0, channels, channels) / count - mean.square()).clamp_min(0.0);
    const torch::Tensor inv_std = (var + eps).rsqrt();
    if (!recomputing_activations()) {
      torch::NoGradGuard no_grad;
      module->running_mean.mul_(1.0 - momentum).add_(mean, momentum);
      module->running_var.mul_(1.0 - momentum)
          .add_(var * count / (count - 1.0).clamp_min(1.0), momentum);
      module->num_batches_tracked.add_(1);
    }
    const torch::Tensor x_hat = (xf - per_channel(mean, x)) * per_channel(inv_std, x);
    ctx->save_for_backward({x_hat, inv_std, weight, count});
    ctx->saved_data["module"] = reinterpret_cast<int64_t>(module);
    return (x_hat * per_channel(weight, x) + per_channel(bias, x)).to(x.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x_hat = saved[0];
    const torch::Tensor& inv_std = saved[1];
    const torch::Tensor& weight = saved[2];
    const torch::Tensor& count = saved[3];
    auto* module = reinterpret_cast<BatchNormImpl*>(ctx->saved_data["module"].toInt());
    const torch::Tensor dy = grads[0].to(torch::kFloat32);
    const std::vector<int64_t> dims = reduced_dims(dy);
    const int64_t channels = dy.size(1);
    const torch::Tensor local_dbias = dy.sum(dims);
    const torch::Tensor local_dweight = (dy * x_hat).sum(dims);
    torch::Tensor sums = torch::cat({local_dbias, local_dweight});
    module->sync->all_reduce(sums, ReduceOp::kSum);
    const torch::Tensor mean_dy = sums.narrow(0, 0, channels) / count;
    const torch::Tensor mean_dy_xhat = sums.narrow(0, channels, channels) / count;
    const torch::Tensor dx =
        per_channel(weight * inv_std, dy) *
        (dy - per_channel(mean_dy, dy) - x_hat * per_channel(mean_dy_xhat, dy));
    // Parameter gradients stay per rank: the data-parallel reducer sums them like all others.
    return {dx.to(grads[0].scalar_type()),
            local_dweight,
            local_dbias,
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }
};

}  // namespace

BatchNormImpl::BatchNormImpl(int64_t features, double eps, double momentum)
    : eps_(eps), momentum_(momentum) {
  weight = register_parameter("weight", torch::ones({features}));
  bias = register_parameter("bias", torch::zeros({features}));
  running_mean = register_buffer("running_mean", torch::zeros({features}));
  running_var = register_buffer("running_var", torch::ones({features}));
  num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kInt64));
}

torch::Tensor BatchNormImpl::forward(const torch::Tensor& x) {
  return forward_output(SummedMap{x});
}

torch::Tensor BatchNormImpl::forward_output(const SummedMap& map) {
  const torch::Tensor& x = map.y;
  if (is_training() && sync != nullptr) {
    return SyncBatchNormFunction::apply(x, weight, bias, this, eps_, momentum_);
  }
  if (runs_own_kernels(x)) {
    return own_kernels(map, torch::Tensor(), torch::Tensor(), false, nullptr)[0];
  }
  if (is_training() && recomputing_activations()) {
    // The first pass of this batch updated the running statistics already.
    return torch::batch_norm(x, weight, bias, {}, {}, true, momentum_, eps_,
                             /*cudnn_enabled=*/true);
  }
  if (is_training()) {
    torch::NoGradGuard no_grad;
    num_batches_tracked.add_(1);
  }
  return torch::batch_norm(x, weight, bias, running_mean, running_var, is_training(), momentum_,
                           eps_,
                           /*cudnn_enabled=*/true);
}

void set_batch_norm_sync(torch::nn::Module& module, Communicator* comm) {
  for (const auto& child : module.modules(/*include_self=*/true)) {
    if (auto* bn = child->as<BatchNormImpl>()) bn->sync = comm;
  }
}

}  // namespace myriad
