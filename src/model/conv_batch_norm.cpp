// BatchNormImpl::convolve: a convolution whose output's batch-norm statistics come from cuDNN's
// epilogue (cuda/convolution_statistics.h), where the build, the run and cuDNN allow it; else the
// plain convolution, whose output the batch norm reads once more for them. Either takes the
// weight's copy from a live WeightCasts, where one was made, instead of autocast's cast.

#include <torch/autograd.h>
#include <torch/version.h>

#include <atomic>
#include <cstdint>
#include <optional>
#include <variant>

#include "myriad/model/batch_norm.h"
#include "myriad/model/weight_casts.h"
#include "myriad/util/autocast.h"
#include "myriad/util/error.h"
#include "myriad/util/format.h"

#ifdef MYRIAD_WITH_CUDNN_GRAPH
#include <ATen/Context.h>

#include "cuda/convolution_statistics.h"
#endif

namespace myriad {

namespace {

std::atomic<bool> statistics_enabled{false};

// The options' variants: std's in LibTorch 2, c10's before.
#if TORCH_VERSION_MAJOR >= 2
using std::get_if;
using std::holds_alternative;
#else
using c10::get_if;
using c10::holds_alternative;
#endif

// `conv` on x with `w`, a cast copy of its weight, in the weight's place.
torch::Tensor convolve_with(const torch::nn::Conv2dImpl& conv, const torch::Tensor& x,
                            const torch::Tensor& w) {
  const torch::nn::detail::ConvNdOptions<2>& o = conv.options;
  MYRIAD_CHECK(holds_alternative<torch::enumtype::kZeros>(o.padding_mode()),
               "a cast weight for a convolution that pads with other than zeros");
  namespace F = torch::nn::functional;
  return F::conv2d(x, w,
                   F::Conv2dFuncOptions()
                       .bias(conv.bias)
                       .stride(o.stride())
                       .padding(o.padding())
                       .dilation(o.dilation())
                       .groups(o.groups()));
}

#ifdef MYRIAD_WITH_CUDNN_GRAPH
// The convolution by the plan, forward; backward takes LibTorch's convolution gradients. The sums
// are a function of y that carries no gradient of its own: the batch norm's backward differentiates
// through its statistics already.
class ConvolutionStatisticsFunction
    : public torch::autograd::Function<ConvolutionStatisticsFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const torch::Tensor& x, const torch::Tensor& weight,
                                                const ConvolutionStatisticsPlan* plan,
                                                int64_t stride, int64_t padding) {
    ConvolutionWithSums out = run_convolution_statistics(*plan, x, weight);
    ctx->mark_non_differentiable({out.sums});
    ctx->save_for_backward({x, weight});
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    return {out.y, out.sums};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const int64_t stride = ctx->saved_data["stride"].toInt();
    const int64_t padding = ctx->saved_data["padding"].toInt();
    const torch::Tensor dy =
        grads[0].contiguous(torch::MemoryFormat::ChannelsLast).to(saved[0].scalar_type());
    const auto gradients = at::convolution_backward(
        dy, saved[0], saved[1], at::OptionalIntArrayRef(), {stride, stride}, {padding, padding},
        {1, 1}, false, {0, 0}, 1, {ctx->needs_input_grad(0), ctx->needs_input_grad(1), false});
    return {std::get<0>(gradients), std::get<1>(gradients), torch::Tensor(), torch::Tensor(),
            torch::Tensor()};
  }
};

// The shape of conv(x) in `dtype`, where the convolution is one the graph takes.
std::optional<ConvolutionShape> shape_of(const torch::nn::Conv2dImpl& conv, const torch::Tensor& x,
                                         torch::ScalarType dtype) {
  const torch::nn::detail::ConvNdOptions<2>& o = conv.options;
  const auto* padding = get_if<torch::ExpandingArray<2>>(&o.padding());
  const bool plain = o.groups() == 1 && !o.bias() && !o.transposed() &&
                     holds_alternative<torch::enumtype::kZeros>(o.padding_mode()) &&
                     padding != nullptr && (*padding)->at(0) == (*padding)->at(1) &&
                     o.stride()->at(0) == o.stride()->at(1) && o.dilation()->at(0) == 1 &&
                     o.dilation()->at(1) == 1 && o.kernel_size()->at(0) == o.kernel_size()->at(1);
  // The graph's tensors are declared 16-byte aligned: the sums' second row too.
  if (!plain || o.out_channels() % 4 != 0 || x.dim() != 4 || x.size(1) != o.in_channels() ||
      !x.is_contiguous(torch::MemoryFormat::ChannelsLast)) {
    return std::nullopt;
  }
  ConvolutionShape s;
  s.device = x.device().index();
  s.dtype = dtype;
  s.batch = x.size(0);
  s.channels = x.size(1);
  s.height = x.size(2);
  s.width = x.size(3);
  s.out_channels = o.out_channels();
  s.kernel = o.kernel_size()->at(0);
  s.stride = o.stride()->at(0);
  s.padding = (*padding)->at(0);
  return s;
}
#endif

}  // namespace

SummedMap BatchNormImpl::convolve(torch::nn::Conv2dImpl& conv, const torch::Tensor& x) {
  // The dtype the convolution computes in: autocast's, else x's own.
  const torch::ScalarType dtype = active_autocast(x.device().type()).value_or(x.scalar_type());
  const torch::Tensor cast = WeightCasts::copy_of(conv.weight, dtype);
#ifdef MYRIAD_WITH_CUDNN_GRAPH
  const bool wanted =
      statistics_enabled && sync == nullptr && is_training() &&
      (dtype == torch::kBFloat16 || dtype == torch::kHalf) &&
      conv.weight.size(0) == weight.size(0) && at::globalContext().userEnabledCuDNN() &&
      !at::globalContext().deterministicCuDNN() && !at::globalContext().deterministicAlgorithms() &&
      batch_norm_runs_own_kernels(x.device(), false, true);
  if (const std::optional<ConvolutionShape> shape =
          wanted ? shape_of(conv, x, dtype) : std::optional<ConvolutionShape>()) {
    const torch::Tensor xs = x.to(dtype);
    const torch::Tensor w = (cast.defined() ? cast : conv.weight.to(dtype))
                                .contiguous(torch::MemoryFormat::ChannelsLast);
    // A view into a larger map may start off the 16 bytes that the graph declares.
    const ConvolutionStatisticsPlan* plan =
        reinterpret_cast<uintptr_t>(xs.data_ptr()) % 16 == 0
            ? convolution_statistics_plan(*shape, xs.detach(), w.detach())
            : nullptr;
    if (plan != nullptr) {
      const torch::autograd::variable_list out =
          ConvolutionStatisticsFunction::apply(xs, w, plan, shape->stride, shape->padding);
      return {out[0], out[1].view({1, 2, -1})};
    }
  }
#endif
  return {cast.defined() ? convolve_with(conv, x, cast) : conv.forward(x), torch::Tensor()};
}

bool use_convolution_statistics(bool enabled) {
  statistics_enabled = enabled;
  return enabled;
}

bool convolution_statistics_built() {
#ifdef MYRIAD_WITH_CUDNN_GRAPH
  return true;
#else
  return false;
#endif
}

#ifndef MYRIAD_WITH_CUDNN_GRAPH
ConvolutionStatisticsReport convolution_statistics_report() {
  return {};
}
#endif

std::string convolution_statistics_state() {
  if (!convolution_statistics_built() || !statistics_enabled) return "off";
#ifdef MYRIAD_WITH_CUDNN_GRAPH
  const ConvolutionStatisticsReport r = convolution_statistics_report();
  const std::string cudnn = "cuDNN " + loaded_cudnn_version();
  if (r.planned + r.unplanned == 0) return "on (" + cudnn + ")";
  std::string state =
      str_format("{} of {} convolution shapes ({})", r.planned, r.planned + r.unplanned, cudnn);
  if (r.unplanned > 0) state += str_format("; cuDNN refused the others: {}", r.first_reason);
  return state;
#else
  return "off";
#endif
}

}  // namespace myriad
