#include "myriad/classifier/shard_optimizer.h"

#include <cmath>

#include "myriad/util/check_cuda.h"
#include "myriad/util/error.h"

#ifdef MYRIAD_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "cuda/kernels.h"
#endif

namespace myriad {

namespace {

torch::Tensor rows_of(const torch::Tensor& t, const torch::Tensor& index, int64_t begin,
                      int64_t end) {
  return index.defined() ? t.index_select(0, index.slice(0, begin, end)) : t.slice(0, begin, end);
}

void write_rows(torch::Tensor& t, const torch::Tensor& index, int64_t begin, int64_t end,
                const torch::Tensor& rows) {
  if (index.defined()) {
    t.index_copy_(0, index.slice(0, begin, end), rows.to(t.scalar_type()));
    return;
  }
  torch::Tensor target = t.slice(0, begin, end);
  // rows_of() returned a view and the update already happened in place.
  if (target.data_ptr() != rows.data_ptr()) target.copy_(rows);
}

#ifdef MYRIAD_WITH_CUDA
cuda::ElementType state_type(torch::ScalarType dtype) {
  return dtype == torch::kBFloat16 ? cuda::ElementType::kBFloat16 : cuda::ElementType::kFloat32;
}
#endif

}  // namespace

OptimizerKind parse_optimizer_kind(const std::string& name) {
  if (name == "sgd") return OptimizerKind::kSgd;
  if (name == "adamw") return OptimizerKind::kAdamW;
  throw UsageError(str_format("unknown optimizer '{}' (sgd or adamw)", name));
}

torch::Tensor unnormalize_row_grad(const torch::Tensor& rows, const torch::Tensor& grad) {
  const torch::Tensor inv_norm = rows.square().sum(1, true).clamp_min(1e-24).rsqrt();
  const torch::Tensor radial = (rows * grad).sum(1, true).mul_(inv_norm.pow(3));
  return grad * inv_norm - rows * radial;
}

ShardOptimizer::ShardOptimizer(const OptimizerOptions& options, int64_t rows, int64_t dim,
                               const torch::Device& device)
    : options_(options) {
  MYRIAD_CHECK(options.state_dtype == torch::kFloat32 || options.state_dtype == torch::kBFloat16,
               "optimizer state must be float32 or bfloat16");
  const auto state = torch::TensorOptions().dtype(options.state_dtype).device(device);
  if (options.kind == OptimizerKind::kSgd) {
    if (options.momentum != 0.0) momentum_ = torch::zeros({rows, dim}, state);
  } else {
    exp_avg_ = torch::zeros({rows, dim}, state);
    exp_avg_sq_ = torch::zeros({rows, dim}, state);
  }
}

void ShardOptimizer::begin_step() {
  ++step_;
}

std::vector<std::pair<std::string, torch::Tensor*>> ShardOptimizer::state() {
  if (options_.kind == OptimizerKind::kSgd) {
    if (!momentum_.defined()) return {};
    return {{"momentum", &momentum_}};
  }
  return {{"exp_avg", &exp_avg_}, {"exp_avg_sq", &exp_avg_sq_}};
}

void ShardOptimizer::update_rows(torch::Tensor& weight, const torch::Tensor& index, int64_t begin,
                                 int64_t end, const torch::Tensor& grad, bool normalized,
                                 double grad_multiplier) {
  const int64_t count = end - begin;
  if (count == 0) return;
  const OptimizerOptions& o = options_;
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(std::max<int64_t>(step_, 1)));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(std::max<int64_t>(step_, 1)));
#ifdef MYRIAD_WITH_CUDA
  if (weight.is_cuda()) {
    const int64_t* rows = index.defined() ? index.data_ptr<int64_t>() : nullptr;
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(weight.device().index()).stream();
    if (o.kind == OptimizerKind::kSgd) {
      const cuda::SgdArgs args{static_cast<float>(o.lr), static_cast<float>(o.momentum),
                               static_cast<float>(o.weight_decay), o.nesterov,
                               static_cast<float>(grad_multiplier)};
      MYRIAD_CHECK_CUDA(cuda::sgd_rows(
          weight.data_ptr<float>(), momentum_.defined() ? momentum_.data_ptr() : nullptr,
          state_type(o.state_dtype), grad.data_ptr<float>(), weight.size(1), rows, begin, count,
          normalized, args, stream));
    } else {
      const cuda::AdamWArgs args{static_cast<float>(o.lr),
                                 static_cast<float>(o.beta1),
                                 static_cast<float>(o.beta2),
                                 static_cast<float>(o.eps),
                                 static_cast<float>(o.weight_decay),
                                 static_cast<float>(bc1),
                                 static_cast<float>(bc2),
                                 static_cast<float>(grad_multiplier)};
      MYRIAD_CHECK_CUDA(cuda::adamw_rows(weight.data_ptr<float>(), exp_avg_.data_ptr(),
                                         exp_avg_sq_.data_ptr(), state_type(o.state_dtype),
                                         grad.data_ptr<float>(), weight.size(1), rows, begin, count,
                                         normalized, args, stream));
    }
    return;
  }
#endif
  torch::Tensor w = rows_of(weight, index, begin, end);
  torch::Tensor g = grad * grad_multiplier;
  if (normalized) g = unnormalize_row_grad(w, g);
  if (o.kind == OptimizerKind::kSgd) {
    torch::Tensor d = g.add_(w, o.weight_decay);
    if (momentum_.defined()) {
      const torch::Tensor buf =
          rows_of(momentum_, index, begin, end).to(torch::kFloat32).mul_(o.momentum).add_(d);
      write_rows(momentum_, index, begin, end, buf);
      d = o.nesterov ? d.add(buf, o.momentum) : buf;
    }
    w.sub_(d, o.lr);
  } else {
    const torch::Tensor m = rows_of(exp_avg_, index, begin, end)
                                .to(torch::kFloat32)
                                .mul_(o.beta1)
                                .add_(g, 1.0 - o.beta1);
    const torch::Tensor v = rows_of(exp_avg_sq_, index, begin, end)
                                .to(torch::kFloat32)
                                .mul_(o.beta2)
                                .addcmul_(g, g, 1.0 - o.beta2);
    write_rows(exp_avg_, index, begin, end, m);
    write_rows(exp_avg_sq_, index, begin, end, v);
    w.mul_(1.0 - o.lr * o.weight_decay)
        .addcdiv_(m, v.sqrt().div_(std::sqrt(bc2)).add_(o.eps), -o.lr / bc1);
  }
  write_rows(weight, index, begin, end, w);
}

}  // namespace myriad
