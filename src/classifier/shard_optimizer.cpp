#include "myriad/classifier/shard_optimizer.h"

#include <algorithm>
#include <cmath>

#include "cpu_row_update.h"
#include "myriad/util/check_cuda.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/stochastic_round.h"

#ifdef MYRIAD_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "cuda/kernels.h"
#endif
#ifdef MYRIAD_WITH_HOPPER_KERNELS
#include "cuda/hopper/fused_weight_update.h"
#endif

namespace myriad {

namespace {

// The update's multiplier (loss scaling undone): undefined, or one float32 beside the weights.
void check_grad_multiplier(const torch::Tensor& multiplier, const torch::Tensor& weight) {
  MYRIAD_CHECK(
      !multiplier.defined() || (multiplier.scalar_type() == torch::kFloat32 &&
                                multiplier.numel() == 1 && multiplier.device() == weight.device()),
      "the gradient multiplier must be one float32 on the weights' device");
}

const float* multiplier_of(const torch::Tensor& multiplier) {
  return multiplier.defined() ? multiplier.data_ptr<float>() : nullptr;
}

SgdArgs sgd_args(const OptimizerOptions& o, const torch::Tensor& multiplier) {
  return {static_cast<float>(o.lr), static_cast<float>(o.momentum),
          static_cast<float>(o.weight_decay), o.nesterov, multiplier_of(multiplier)};
}

AdamWArgs adamw_args(const OptimizerOptions& o, int64_t step, const torch::Tensor& multiplier) {
  const double t = static_cast<double>(std::max<int64_t>(step, 1));
  return {static_cast<float>(o.lr),
          static_cast<float>(o.beta1),
          static_cast<float>(o.beta2),
          static_cast<float>(o.eps),
          static_cast<float>(o.weight_decay),
          static_cast<float>(1.0 - std::pow(o.beta1, t)),
          static_cast<float>(1.0 - std::pow(o.beta2, t)),
          multiplier_of(multiplier)};
}

}  // namespace

torch::Tensor row_grad_of_rows(const torch::Tensor& rows, const torch::Tensor& grad,
                               RowGradient grad_of) {
  if (grad_of == RowGradient::kRow) return grad;
  const torch::Tensor inv_norm = rows.square().sum(1, true).clamp_min(1e-24).rsqrt();
  const torch::Tensor dot = (rows * grad).sum(1, true);
  if (grad_of == RowGradient::kUnitRowOverNorm) return grad - rows * dot.mul_(inv_norm.square());
  return grad * inv_norm - rows * dot.mul_(inv_norm.pow(3));
}

ShardOptimizer::ShardOptimizer(const OptimizerOptions& options, int64_t rows, int64_t dim,
                               const torch::Device& device, int64_t first_row, uint64_t seed)
    : options_(options), first_row_(first_row), seed_(seed) {
  MYRIAD_CHECK(options.state_dtype == torch::kFloat32 || options.state_dtype == torch::kBFloat16,
               "optimizer state must be float32 or bfloat16");
  MYRIAD_CHECK(first_row >= 0, "a shard's first class cannot be negative");
  const auto state = torch::TensorOptions().dtype(options.state_dtype).device(device);
  if (options.kind == OptimizerKind::kSgd) {
    if (options.momentum != 0.0) momentum_ = torch::zeros({rows, dim}, state);
  } else {
    exp_avg_ = torch::zeros({rows, dim}, state);
    exp_avg_sq_ = torch::zeros({rows, dim}, state);
  }
#ifdef MYRIAD_WITH_HOPPER_KERNELS
  if (device.is_cuda() && dim <= kFusedMaxDim) {
    std::vector<int64_t> order(cuda::fused_sgd_rows_xt_rows(static_cast<int>(dim)));
    for (size_t p = 0; p < order.size(); ++p)
      order[p] = cuda::fused_sgd_rows_column(static_cast<int>(p));
    column_order_ = torch::tensor(order).to(device);
  }
#endif
}

void ShardOptimizer::begin_step() {
  ++step_;
}

uint64_t ShardOptimizer::rounding_seed() const {
  return splitmix64(splitmix64(seed_ ^ 0x5EEDB16Full) + static_cast<uint64_t>(step_));
}

std::vector<std::pair<std::string, torch::Tensor*>> ShardOptimizer::state() {
  if (options_.kind == OptimizerKind::kSgd) {
    if (!momentum_.defined()) return {};
    return {{"momentum", &momentum_}};
  }
  return {{"exp_avg", &exp_avg_}, {"exp_avg_sq", &exp_avg_sq_}};
}

bool ShardOptimizer::updates_from_logit_grad(OptimizerKind kind, int64_t batch, int64_t dim,
                                             torch::ScalarType weight_dtype) {
#ifdef MYRIAD_WITH_HOPPER_KERNELS
  return kind == OptimizerKind::kSgd &&
         cuda::fused_sgd_rows_take(batch, static_cast<int>(dim), element_type(weight_dtype));
#else
  (void)kind, (void)batch, (void)dim, (void)weight_dtype;
  return false;
#endif
}

torch::Tensor ShardOptimizer::logit_grad_update_features(const torch::Tensor& x) const {
#ifdef MYRIAD_WITH_HOPPER_KERNELS
  MYRIAD_CHECK(
      column_order_.defined() && x.dim() == 2 &&
          column_order_.size(0) == cuda::fused_sgd_rows_xt_rows(static_cast<int>(x.size(1))) &&
          x.device() == column_order_.device(),
      "the fused weight update's features must be [B, D] on the optimizer's GPU, got {} "
      "on {}",
      x.sizes(), x.device().str());
  const torch::Tensor padded = torch::constant_pad_nd(x, {0, column_order_.size(0) - x.size(1)});
  return padded.index_select(1, column_order_).t().contiguous();
#else
  (void)x;
  MYRIAD_THROW("the fused weight update needs a build with the fused Hopper kernels");
#endif
}

void ShardOptimizer::update_rows_from_logit_grad(torch::Tensor& weight, const torch::Tensor& index,
                                                 int64_t begin, int64_t end,
                                                 const torch::Tensor& logit_grad,
                                                 const torch::Tensor& xt, RowGradient grad_of,
                                                 const torch::Tensor& grad_multiplier) {
  const int64_t batch = xt.size(1);
  MYRIAD_CHECK(weight.is_cuda() && updates_from_logit_grad(options_.kind, batch, weight.size(1),
                                                           weight.scalar_type()),
               "the fused weight update runs SGD on bfloat16 rows on H100 and H200 GPUs, for "
               "batches that are multiples of 8 and embedding sizes that are multiples of 8 up to "
               "512 (this call: {}, {}, {} rows, batch {}, embedding size {})",
               weight.device().str(), options_.kind == OptimizerKind::kSgd ? "SGD" : "AdamW",
               weight.scalar_type(), batch, weight.size(1));
  MYRIAD_CHECK(logit_grad.scalar_type() == torch::kBFloat16 &&
                   xt.scalar_type() == torch::kBFloat16 && logit_grad.is_contiguous() &&
                   xt.is_contiguous() && logit_grad.size(0) == end - begin &&
                   logit_grad.size(1) == batch && column_order_.defined() &&
                   xt.size(0) == column_order_.size(0),
               "the fused weight update takes a contiguous bfloat16 logits' gradient [{}, {}] and "
               "the features from logit_grad_update_features [{}, {}], got {} and {}",
               end - begin, batch, column_order_.defined() ? column_order_.size(0) : 0, batch,
               logit_grad.sizes(), xt.sizes());
  check_grad_multiplier(grad_multiplier, weight);
#ifdef MYRIAD_WITH_HOPPER_KERNELS
  const cuda::WeightShard shard{weight.data_ptr(), element_type(weight.scalar_type()), first_row_,
                                rounding_seed()};
  MYRIAD_CHECK_CUDA(cuda::fused_sgd_rows(
      shard, momentum_.defined() ? momentum_.data_ptr() : nullptr,
      element_type(options_.state_dtype), logit_grad.data_ptr(), xt.data_ptr(), batch,
      static_cast<int>(weight.size(1)), index.defined() ? index.data_ptr<int64_t>() : nullptr,
      begin, end - begin, grad_of, sgd_args(options_, grad_multiplier),
      c10::cuda::getCurrentCUDAStream(weight.device().index()).stream()));
#else
  (void)index, (void)grad_of;
#endif
}

bool ShardOptimizer::update_rows(torch::Tensor& weight, const torch::Tensor& index, int64_t begin,
                                 int64_t end, const torch::Tensor& grad, RowGradient grad_of,
                                 const torch::Tensor& grad_multiplier, const NextForward& next) {
  const int64_t count = end - begin;
  if (count == 0) return false;
  check_grad_multiplier(grad_multiplier, weight);
  MYRIAD_CHECK(weight.scalar_type() == torch::kFloat32 || weight.scalar_type() == torch::kBFloat16,
               "classifier weights must be float32 or bfloat16");
  MYRIAD_CHECK(
      (grad.scalar_type() == torch::kFloat32 || grad.scalar_type() == torch::kBFloat16) &&
          grad.is_contiguous() && grad.dim() == 2 && grad.size(0) == count &&
          grad.size(1) == weight.size(1),
      "the rows' gradient must be a contiguous float32 or bfloat16 [{}, {}] matrix, not {} "
      "{}",
      count, weight.size(1), c10::toString(grad.scalar_type()), grad.sizes());
  if (!weight.is_cuda()) {
    update_rows_cpu(
        {weight, index, begin, end, grad, grad_of, first_row_, rounding_seed(), torch::Tensor()},
        grad_multiplier);
    return false;
  }
#ifdef MYRIAD_WITH_CUDA
  const int64_t* rows = index.defined() ? index.data_ptr<int64_t>() : nullptr;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(weight.device().index()).stream();
  const cuda::WeightShard shard{weight.data_ptr(), element_type(weight.scalar_type()), first_row_,
                                rounding_seed()};
  if (options_.kind == OptimizerKind::kAdamW) {
    MYRIAD_CHECK_CUDA(cuda::adamw_rows(
        shard, exp_avg_.data_ptr(), exp_avg_sq_.data_ptr(), element_type(options_.state_dtype),
        grad.data_ptr(), element_type(grad.scalar_type()), weight.size(1), rows, begin, count,
        grad_of, adamw_args(options_, step_, grad_multiplier), stream));
    return false;
  }
  cuda::NextForwardRows rows_for_next{next.inv_norms, nullptr, cuda::ElementType::kBFloat16,
                                      next.normalize};
  if (next.copy.defined()) {
    // Sampled rows would leave the rest of the copy as it was.
    MYRIAD_CHECK(!index.defined(), "the rows' copy for the next forward takes every row's update");
    MYRIAD_CHECK(next.copy.is_contiguous() && next.copy.sizes() == weight.sizes() &&
                     next.copy.device() == weight.device(),
                 "the rows' copy for the next forward must be a contiguous {} on {}, not {} on {}",
                 weight.sizes(), weight.device().str(), next.copy.sizes(),
                 next.copy.device().str());
    rows_for_next.copy = next.copy.data_ptr();
    rows_for_next.copy_type = element_type(next.copy.scalar_type());
  }
  bool written = false;
  MYRIAD_CHECK_CUDA(cuda::sgd_rows(shard, momentum_.defined() ? momentum_.data_ptr() : nullptr,
                                   element_type(options_.state_dtype), grad.data_ptr(),
                                   element_type(grad.scalar_type()), weight.size(1), rows, begin,
                                   count, grad_of, sgd_args(options_, grad_multiplier), stream,
                                   rows_for_next, &written));
  return written;
#else
  (void)next;
  MYRIAD_THROW("a CUDA weight in a build without CUDA");
#endif
}

void ShardOptimizer::update_rows_from_product(torch::Tensor& weight, const torch::Tensor& index,
                                              int64_t begin, int64_t end,
                                              const torch::Tensor& logit_grad,
                                              const torch::Tensor& features, RowGradient grad_of,
                                              const torch::Tensor& grad_multiplier) {
  MYRIAD_CHECK(!weight.is_cuda() && features.defined(),
               "the rows' gradient formed in the row kernel is the CPU's update, got {} rows",
               weight.device().str());
  if (end == begin) return;
  check_grad_multiplier(grad_multiplier, weight);
  update_rows_cpu(
      {weight, index, begin, end, logit_grad, grad_of, first_row_, rounding_seed(), features},
      grad_multiplier);
}

void ShardOptimizer::update_rows_cpu(const CpuRowUpdate& rows,
                                     const torch::Tensor& grad_multiplier) {
  if (options_.kind == OptimizerKind::kSgd) {
    sgd_rows_cpu(rows, momentum_, sgd_args(options_, grad_multiplier));
  } else {
    adamw_rows_cpu(rows, exp_avg_, exp_avg_sq_, adamw_args(options_, step_, grad_multiplier));
  }
}

}  // namespace myriad
