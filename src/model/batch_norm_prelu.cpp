// Batch norm, alone or followed by PReLU or a residual's add, in kernels of our own on GPUs
// (BatchNormImpl::forward, forward_prelu and forward_add): the statistics pass (none where the
// kernel that wrote the input summed it), then one pass that normalises and applies the slope or
// adds the residual, and may sum its output for the next batch norm; backward recomputes the
// normalised values from the input, so the batch norm's output is neither written nor kept. With
// PReLU, two passes each way instead of five forward and eight backward, and one activation less
// kept per pair. LibTorch's own channels-last statistics kernel (Welford, a division per element)
// read at about a sixth of an H100's memory rate; ours at near the rate.

#include <torch/autograd.h>

#include <atomic>

#include "myriad/model/backbone.h"
#include "myriad/model/batch_norm.h"
#include "myriad/util/autocast.h"
#include "myriad/util/check_cuda.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"

#ifdef MYRIAD_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "cuda/batch_norm_prelu_kernels.h"
#endif

namespace myriad {

namespace {
std::atomic<int64_t> statistics_passes{0}, output_sums_formed{0}, backward_folds_set{0};
std::atomic<bool> backward_folds{true};
}  // namespace

BatchNormRouteCount batch_norm_route_count() {
  return {statistics_passes.load(std::memory_order_relaxed),
          output_sums_formed.load(std::memory_order_relaxed),
          backward_folds_set.load(std::memory_order_relaxed)};
}

bool use_backward_folds(bool enabled) {
  backward_folds = enabled;
  return enabled;
}

bool backward_folds_enabled() {
  return backward_folds;
}

#ifdef MYRIAD_WITH_CUDA
namespace {

// The layout the kernels read: the channel moves fastest.
torch::MemoryFormat channels_fastest(const torch::Tensor& x) {
  return x.dim() == 4 ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous;
}

cuda::BatchNormPReLUParams params_of(const torch::Tensor& mean, const torch::Tensor& invstd,
                                     const torch::Tensor& gamma, const torch::Tensor& beta,
                                     const torch::Tensor& alpha) {
  return {mean.data_ptr<float>(),
          invstd.data_ptr<float>(),
          gamma.data_ptr<float>(),
          beta.data_ptr<float>(),
          alpha.numel() > 0 ? alpha.data_ptr<float>() : nullptr,
          alpha.numel() > 1 ? 1 : 0};
}

// A gradient in x's dtype and layout, as the kernels read it.
torch::Tensor in_layout_of(const torch::Tensor& x, const torch::Tensor& grad) {
  return grad.to(x.scalar_type()).contiguous(channels_fastest(x));
}

cudaStream_t stream_of(const torch::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

// What a node does besides batch norm and its PReLU or residual.
struct NodeSpec {
  double momentum, eps;
  bool fork;               // the input again, for a second use (forward_fork)
  const SummedMap* sums;   // the input, with its sums where a kernel formed them
  SummedMap* output_sums;  // where not null, receives the output's sums and shift
  int64_t* batches;        // num_batches_tracked, counted by the statistics' kernel; null: not
                           // counted (a recomputation)
  bool folds;  // may offer or take a BackwardFold: folds are on, a backward will run (grad mode),
               // and this is no recomputation, whose blocks hand nothing on
};

// The fold's handle in an autograd node's saved data, and back.
c10::IValue fold_capsule(const c10::intrusive_ptr<BackwardFold>& fold) {
  return c10::IValue::make_capsule(fold);
}

c10::intrusive_ptr<BackwardFold> saved_fold(torch::autograd::AutogradContext* ctx,
                                            const char* key) {
  const auto found = ctx->saved_data.find(key);
  if (found == ctx->saved_data.end()) return {};
  return c10::static_intrusive_pointer_cast<BackwardFold>(found->second.toCapsule());
}

// The fold a node without a slope offers the batch norm reading its output, where it sums that
// output.
c10::intrusive_ptr<BackwardFold> offered_fold(const torch::Tensor& x, const torch::Tensor& mean,
                                              const torch::Tensor& invstd,
                                              const torch::Tensor& alpha, const NodeSpec& spec) {
  if (!spec.folds || spec.output_sums == nullptr || alpha.numel() > 0) return {};
  auto fold = c10::make_intrusive<BackwardFold>();
  fold->input = x.detach();
  fold->mean = mean;
  fold->invstd = invstd;
  return fold;
}

// Whether this node's backward can form the sums of the batch norm that wrote x: its input, not yet
// released by a backward, of x's device, dtype, shape and layout.
bool takes_fold(const torch::Tensor& x, const NodeSpec& spec) {
  const c10::intrusive_ptr<BackwardFold>& fold = spec.sums->fold;
  return spec.folds && fold && fold->input.defined() && fold->input.device() == x.device() &&
         fold->input.scalar_type() == x.scalar_type() && fold->input.sizes() == x.sizes() &&
         fold->input.strides() == x.strides();
}

// mean and invstd of x's channels, from spec.sums where a kernel formed them, else by the
// statistics pass; the running statistics updated unless empty (a recomputation).
std::pair<torch::Tensor, torch::Tensor> batch_statistics(const torch::Tensor& x,
                                                         torch::Tensor& running_mean,
                                                         torch::Tensor& running_var,
                                                         const NodeSpec& spec) {
  const int64_t channels = x.size(1), rows = x.numel() / std::max<int64_t>(channels, 1);
  const torch::TensorOptions floats = x.options().dtype(torch::kFloat32);
  torch::Tensor mean = torch::empty({channels}, floats);
  torch::Tensor invstd = torch::empty({channels}, floats);
  const bool running = running_mean.numel() > 0;
  const cuda::RunningStatistics updated{running ? running_mean.data_ptr<float>() : nullptr,
                                        running ? running_var.data_ptr<float>() : nullptr,
                                        spec.batches};
  const auto e = static_cast<float>(spec.eps), m = static_cast<float>(spec.momentum);
  const SummedMap& given = *spec.sums;
  if (given.sums.defined()) {
    const torch::Tensor sums = given.sums.contiguous();
    const torch::Tensor shift = given.shift.defined() ? given.shift.contiguous() : given.shift;
    MYRIAD_CHECK(sums.dim() == 3 && sums.size(1) == 2 && sums.size(2) == channels &&
                     sums.scalar_type() == torch::kFloat32 &&
                     (!shift.defined() || shift.numel() == channels),
                 "a batch norm of {} channels was handed sums of shape {}", channels,
                 c10::IntArrayRef(sums.sizes()));
    MYRIAD_CHECK_CUDA(cuda::batch_norm_statistics_from_sums(
        sums.data_ptr<float>(), shift.defined() ? shift.data_ptr<float>() : nullptr, sums.size(0),
        rows, channels, e, m, mean.data_ptr<float>(), invstd.data_ptr<float>(), updated,
        stream_of(x)));
  } else {
    statistics_passes.fetch_add(1, std::memory_order_relaxed);
    const torch::Tensor partials = torch::empty({cuda::batch_norm_partials(channels)}, floats);
    MYRIAD_CHECK_CUDA(cuda::batch_norm_statistics(x.data_ptr(), element_type(x.scalar_type()), rows,
                                                  channels, e, m, partials.data_ptr<float>(),
                                                  mean.data_ptr<float>(), invstd.data_ptr<float>(),
                                                  updated, stream_of(x)));
  }
  return {mean, invstd};
}

// The buffer of the sums that the forward pass forms over `channels`, where wanted, and their
// views once it ran.
class OutputSumsBuffer {
 public:
  OutputSumsBuffer(const torch::Tensor& like, int64_t channels, bool wanted) : channels_(channels) {
    if (!wanted) return;
    buffer_ =
        torch::empty({cuda::batch_norm_partials(channels)}, like.options().dtype(torch::kFloat32));
    sums_.partials = buffer_.data_ptr<float>();
  }
  cuda::OutputSums* launch() { return buffer_.defined() ? &sums_ : nullptr; }
  // Sets map's sums and shift.
  void store(SummedMap& map) const {
    map.sums =
        buffer_.narrow(0, 0, sums_.blocks * 2 * channels_).view({sums_.blocks, 2, channels_});
    map.shift = buffer_.narrow(0, cuda::batch_norm_shift_offset(channels_), channels_);
  }

 private:
  int64_t channels_;
  torch::Tensor buffer_;
  cuda::OutputSums sums_;
};

class BatchNormPReLUFunction : public torch::autograd::Function<BatchNormPReLUFunction> {
 public:
  // alpha empty: batch norm alone; residual empty: nothing added (else of the input's dtype and
  // shape). running_mean and running_var are updated unless empty (a recomputation). Empty rather
  // than undefined: autograd records every input's device. Returns y, and where spec.fork the
  // input again, for a second use of it whose gradient backward adds into the input's.
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext* ctx, const torch::Tensor& input, const torch::Tensor& gamma,
      const torch::Tensor& beta, const torch::Tensor& alpha, const torch::Tensor& residual,
      torch::Tensor running_mean, torch::Tensor running_var, NodeSpec spec) {
    // The input's dtype throughout; the statistics and parameters in float32.
    const NoAutocast no_autocast;
    const torch::Tensor x = input.contiguous(channels_fastest(input));
    const int64_t channels = x.size(1), rows = x.numel() / std::max<int64_t>(channels, 1);
    const auto [mean, invstd] = batch_statistics(x, running_mean, running_var, spec);
    const torch::Tensor g = gamma.to(torch::kFloat32).contiguous();
    const torch::Tensor b = beta.to(torch::kFloat32).contiguous();
    const torch::Tensor a = alpha.to(torch::kFloat32).contiguous();
    const torch::Tensor r =
        residual.numel() > 0 ? residual.contiguous(channels_fastest(input)) : residual;
    torch::Tensor y = torch::empty_like(x);
    OutputSumsBuffer output_sums(y, channels, spec.output_sums != nullptr);
    MYRIAD_CHECK_CUDA(cuda::batch_norm_prelu_forward(
        x.data_ptr(), r.numel() > 0 ? r.data_ptr() : nullptr, y.data_ptr(),
        element_type(x.scalar_type()), rows, channels, params_of(mean, invstd, g, b, a),
        output_sums.launch(), stream_of(x)));
    if (spec.output_sums != nullptr) {
      output_sums.store(*spec.output_sums);
      output_sums_formed.fetch_add(1, std::memory_order_relaxed);
    }
    ctx->saved_data["residual"] = r.numel() > 0;
    if (const auto offered = offered_fold(x, mean, invstd, a, spec)) {
      spec.output_sums->fold = offered;
      ctx->saved_data["folded"] = fold_capsule(offered);
    }
    if (takes_fold(x, spec)) {
      ctx->saved_data["fold"] = fold_capsule(spec.sums->fold);
      backward_folds_set.fetch_add(1, std::memory_order_relaxed);
    }
    ctx->save_for_backward({x, mean, invstd, g, b, a});
    if (!spec.fork) return {y};
    // An unused second use's gradient stays undefined rather than a tensor of zeros to add.
    ctx->set_materialize_grads(false);
    return {y, input};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& alpha = saved[5];
    const torch::Tensor dy = in_layout_of(x, grads[0].defined() ? grads[0] : torch::zeros_like(x));
    const torch::Tensor dbranch =
        grads.size() > 1 && grads[1].defined() ? in_layout_of(x, grads[1]) : torch::Tensor();
    const cuda::BatchNormPReLUParams p = params_of(saved[1], saved[2], saved[3], saved[4], alpha);
    torch::Tensor partials =
        torch::empty({cuda::batch_norm_partials(x.size(1))}, saved[1].options());
    const torch::Tensor sums = backward_sums(ctx, x, dy, grads[0], p, partials);
    const torch::Tensor dx = input_gradient(ctx, x, dy, dbranch, p, sums, partials);
    const torch::Tensor dalpha = alpha.numel() == 0   ? torch::Tensor()
                                 : alpha.numel() == 1 ? sums[2].sum().reshape({1})
                                                      : sums[2];
    // The residual's gradient is the output's.
    const torch::Tensor dresidual = ctx->saved_data["residual"].toBool() ? dy : torch::Tensor();
    return {dx,        sums[1],         sums[0],         dalpha,
            dresidual, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }

 private:
  // Σ dz, Σ dz x̂ and Σ dy z [z <= 0] per channel: formed by the next batch norm's backward where
  // it folded them for exactly this gradient (`incoming`, unchanged), else by a pass of their own.
  static torch::Tensor backward_sums(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                     const torch::Tensor& dy, const torch::Tensor& incoming,
                                     const cuda::BatchNormPReLUParams& p, torch::Tensor& partials) {
    if (const auto fold = saved_fold(ctx, "folded")) {
      const bool same = fold->sums.defined() && incoming.defined() && incoming.is_same(fold->dy) &&
                        incoming._version() == fold->dy_version;
      const torch::Tensor sums = fold->sums;
      fold->release();
      if (same) return sums;
    }
    const int64_t channels = x.size(1), rows = x.numel() / std::max<int64_t>(channels, 1);
    torch::Tensor sums = torch::empty({3, channels}, partials.options());
    MYRIAD_CHECK_CUDA(cuda::batch_norm_prelu_backward_reduce(
        x.data_ptr(), dy.data_ptr(), element_type(x.scalar_type()), rows, channels, p,
        partials.data_ptr<float>(), sums.data_ptr<float>(), stream_of(x)));
    return sums;
  }

  // dx, and where this node took a fold, the sums of the batch norm that wrote x, formed from dx
  // in the same pass and handed to that batch norm's backward, which runs next on it.
  static torch::Tensor input_gradient(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                      const torch::Tensor& dy, const torch::Tensor& dbranch,
                                      const cuda::BatchNormPReLUParams& p,
                                      const torch::Tensor& sums, torch::Tensor& partials) {
    const int64_t channels = x.size(1), rows = x.numel() / std::max<int64_t>(channels, 1);
    c10::intrusive_ptr<BackwardFold> fold = saved_fold(ctx, "fold");
    if (fold && !fold->input.defined()) fold.reset();
    torch::Tensor folded_sums;
    cuda::FoldedSums folded;
    if (fold) {
      folded_sums = torch::empty({2, channels}, partials.options());
      folded = {fold->input.data_ptr(), fold->mean.data_ptr<float>(),
                fold->invstd.data_ptr<float>(), partials.data_ptr<float>(),
                folded_sums.data_ptr<float>()};
    }
    torch::Tensor dx = torch::empty_like(x);
    MYRIAD_CHECK_CUDA(cuda::batch_norm_prelu_backward_input(
        x.data_ptr(), dy.data_ptr(), dbranch.defined() ? dbranch.data_ptr() : nullptr,
        dx.data_ptr(), element_type(x.scalar_type()), rows, channels, p, sums.data_ptr<float>(),
        fold ? &folded : nullptr, stream_of(x)));
    if (fold) {
      fold->sums = folded_sums;
      fold->dy = dx;
      fold->dy_version = dx._version();
    }
    return dx;
  }
};

}  // namespace
#endif

bool batch_norm_runs_own_kernels(const torch::Device& device, bool synchronised,
                                 bool channels_last) {
#ifdef MYRIAD_WITH_CUDA
  return device.is_cuda() && !synchronised && channels_last;
#else
  (void)device;
  (void)synchronised;
  (void)channels_last;
  return false;
#endif
}

const char* batch_norm_kernels(const torch::Device& device, bool synchronised, bool channels_last) {
  return batch_norm_runs_own_kernels(device, synchronised, channels_last)
             ? "myriad's kernels (with PReLU, residual adds, the shortcut's gradient, the next "
               "batch norm's statistics and a block's backward sums)"
             : "LibTorch's";
}

bool BatchNormImpl::runs_own_kernels(const torch::Tensor& x) const {
  // More than one value per channel, in a dtype the kernels take. SyncBN, evaluation and the CPU
  // take LibTorch's batch norm.
  const torch::ScalarType dtype = x.scalar_type();
  return is_training() &&
         batch_norm_runs_own_kernels(
             x.device(), sync != nullptr,
             x.dim() == 2 ||
                 (x.dim() == 4 && x.is_contiguous(torch::MemoryFormat::ChannelsLast))) &&
         (dtype == torch::kFloat32 || dtype == torch::kBFloat16 || dtype == torch::kFloat16) &&
         x.size(1) == weight.size(0) && x.numel() > x.size(1);
}

torch::autograd::variable_list BatchNormImpl::own_kernels(const SummedMap& x,
                                                          const torch::Tensor& prelu_weight,
                                                          const torch::Tensor& residual, bool fork,
                                                          SummedMap* output_sums) {
#ifdef MYRIAD_WITH_CUDA
  const bool recompute = recomputing_activations();
  // Under autocast LibTorch's batch norm runs in the input's dtype with float32 statistics: so do
  // the kernels.
  const torch::Tensor none = torch::empty({0}, running_mean.options());
  return BatchNormPReLUFunction::apply(
      x.y, weight, bias, prelu_weight.defined() ? prelu_weight : none,
      residual.defined() ? residual : none, recompute ? none : running_mean,
      recompute ? none : running_var,
      NodeSpec{momentum_, eps_, fork, &x, output_sums,
               recompute ? nullptr : num_batches_tracked.data_ptr<int64_t>(),
               !recompute && torch::GradMode::is_enabled() && backward_folds_enabled()});
#else
  (void)x;
  (void)prelu_weight;
  (void)residual;
  (void)fork;
  (void)output_sums;
  MYRIAD_THROW("batch norm's own kernels need a CUDA build");
#endif
}

SummedMap BatchNormImpl::own_output(const SummedMap& map, const torch::Tensor& prelu_weight,
                                    const torch::Tensor& residual, bool sum_output) {
  SummedMap out;
  out.y = own_kernels(map, prelu_weight, residual, false, sum_output ? &out : nullptr)[0];
  return out;
}

torch::Tensor BatchNormImpl::forward_prelu(const torch::Tensor& x,
                                           const torch::Tensor& prelu_weight) {
  return forward_prelu(SummedMap{x}, prelu_weight).y;
}

SummedMap BatchNormImpl::forward_prelu(const SummedMap& map, const torch::Tensor& prelu_weight,
                                       bool sum_output) {
  const torch::Tensor& x = map.y;
  if (runs_own_kernels(x) && (prelu_weight.numel() == 1 || prelu_weight.numel() == x.size(1)))
    return own_output(map, prelu_weight, torch::Tensor(), sum_output);
  return {torch::prelu(forward_output(map), prelu_weight)};
}

torch::Tensor BatchNormImpl::forward_add(const torch::Tensor& x, const torch::Tensor& residual) {
  return forward_add(SummedMap{x}, residual).y;
}

SummedMap BatchNormImpl::forward_add(const SummedMap& map, const torch::Tensor& residual,
                                     bool sum_output) {
  const torch::Tensor& x = map.y;
  if (runs_own_kernels(x) && residual.scalar_type() == x.scalar_type() &&
      residual.sizes() == x.sizes() && residual.device() == x.device())
    return own_output(map, torch::Tensor(), residual, sum_output);
  return {forward_output(map) + residual};
}

std::pair<torch::Tensor, torch::Tensor> BatchNormImpl::forward_fork(const torch::Tensor& x) {
  return forward_fork(SummedMap{x});
}

std::pair<torch::Tensor, torch::Tensor> BatchNormImpl::forward_fork(const SummedMap& x) {
  if (runs_own_kernels(x.y)) {
    const torch::autograd::variable_list outputs =
        own_kernels(x, torch::Tensor(), torch::Tensor(), true, nullptr);
    return {outputs[0], outputs[1]};
  }
  return {forward_output(x), x.y};
}

}  // namespace myriad
