#pragma once

#include <torch/torch.h>

#include <utility>

namespace myriad {

class Communicator;

// What a batch norm without a slope (IResNet's bn3) shares with the batch norm that reads its
// output, so that the second one's backward forms the first one's backward sums in the pass that
// writes its dy (use_backward_folds): the first one's input and statistics, and once that backward
// ran, the sums and the gradient they were formed from. The first one takes them only where its
// incoming gradient is that very tensor, unchanged: not where the output had another use.
struct BackwardFold : torch::CustomClassHolder {
  torch::Tensor input, mean, invstd;
  torch::Tensor sums, dy;  // [2, C]: Σ dy and Σ dy x̂; and dy
  uint32_t dy_version = 0;

  // The first batch norm's backward, the last to read them, ran: the input goes as autograd
  // releases its saved tensors (a second backward over a kept graph folds no more).
  void release() { input = mean = invstd = sums = dy = torch::Tensor(); }
};

// A map on its way to a batch norm, with the per-channel sums that the kernel writing it formed, so
// that the batch norm makes no statistics pass over it: `sums` [B, 2, C] float32, over B blocks of
// rows, Σ (y - shift) and Σ (y - shift)², with `shift` [C] float32 (undefined: 0). A batch norm's
// own kernels form them shifted by the output's first row, near the mean; cuDNN's convolutions
// (convolve) unshifted, B = 1. The sums are undefined where no kernel formed them. `fold`, where
// the batch norm that wrote the map offers its backward sums to the one reading it.
struct SummedMap {
  SummedMap() = default;
  // A map without sums, or with them. (Not explicit: a plain map is a SummedMap.)
  SummedMap(torch::Tensor y, torch::Tensor sums = {}, torch::Tensor shift = {})
      : y(std::move(y)), sums(std::move(sums)), shift(std::move(shift)) {}

  torch::Tensor y, sums, shift;
  c10::intrusive_ptr<BackwardFold> fold;
};

// Batch normalisation over dim 1 of [N, C] or [N, C, *] inputs, with the parameters and buffers
// of LibTorch's BatchNorm (weight, bias, running_mean, running_var, num_batches_tracked), so
// exported weights load into any framework. In training mode it normalises with the statistics of
// this rank's batch, or, once synchronised (set_batch_norm_sync), of the global batch over all
// ranks: one all-reduce of per-channel sums in forward and one in backward (SyncBN). Then the
// forward pass, and so the loss, does not depend on how the global batch is split. Training on a
// GPU with per-rank statistics and the channel fastest in memory (channels-last maps, [N, C]
// matrices), it runs kernels of its own (batch_norm_prelu.cpp): two passes each way, bit for bit
// the same at every run.
class BatchNormImpl : public torch::nn::Module {
 public:
  explicit BatchNormImpl(int64_t features, double eps = 1e-5, double momentum = 0.1);
  torch::Tensor forward(const torch::Tensor& x);
  // conv(x), the convolution whose output this batch norm normalises next. Where that runs the
  // kernels below with 16-bit maps (autocast) and cuDNN's graph API has an engine for the shape,
  // one cuDNN graph writes the output and its sums. Not under --deterministic (cuDNN's sums are
  // not ordered) nor where use_convolution_statistics(false).
  SummedMap convolve(torch::nn::Conv2dImpl& conv, const torch::Tensor& x);
  // forward(map.y), with the statistics from map.sums where they are defined. (Not an overload of
  // forward: a Sequential holds batch norms.)
  torch::Tensor forward_output(const SummedMap& map);
  // torch::prelu(forward(x), prelu_weight), the PReLU's slope [C] or [1]. Where forward runs its
  // own kernels, the slope is applied in the same two passes each way, and only x is kept for
  // backward. Given a SummedMap, returns one: with `sum_output`, and where the kernels run, the
  // output's sums for the batch norm that reads it next, formed in the pass that writes it.
  torch::Tensor forward_prelu(const torch::Tensor& x, const torch::Tensor& prelu_weight);
  SummedMap forward_prelu(const SummedMap& map, const torch::Tensor& prelu_weight,
                          bool sum_output = false);
  // forward(x) + residual, where forward runs its own kernels in the pass that writes the output
  // (a residual block's last batch norm): the sum's pass over memory is saved. Given a SummedMap,
  // as forward_prelu.
  torch::Tensor forward_add(const torch::Tensor& x, const torch::Tensor& residual);
  SummedMap forward_add(const SummedMap& map, const torch::Tensor& residual,
                        bool sum_output = false);
  // {forward(x), x} for a second use of x (a residual block's shortcut). Where forward runs its own
  // kernels, the second use's gradient is added in the pass that writes x's: the sum of x's two
  // gradients costs no pass of its own.
  std::pair<torch::Tensor, torch::Tensor> forward_fork(const torch::Tensor& x);
  std::pair<torch::Tensor, torch::Tensor> forward_fork(const SummedMap& x);

  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  Communicator* sync = nullptr;

  double eps() const { return eps_; }

 private:
  bool runs_own_kernels(const torch::Tensor& x) const;
  // Batch norm of x.y, with the statistics from x.sums where defined, followed by PReLU unless
  // prelu_weight is undefined, plus residual unless undefined, in our kernels; where `fork`, x.y
  // again (forward_fork); where output_sums is not null, the output's sums into it.
  torch::autograd::variable_list own_kernels(const SummedMap& x, const torch::Tensor& prelu_weight,
                                             const torch::Tensor& residual, bool fork,
                                             SummedMap* output_sums);
  // own_kernels' output alone, with its sums where `sum_output`.
  SummedMap own_output(const SummedMap& map, const torch::Tensor& prelu_weight,
                       const torch::Tensor& residual, bool sum_output);

  double eps_;
  double momentum_;
};
TORCH_MODULE(BatchNorm);

// Whether training on `device` runs batch norm in myriad's kernels, with PReLU and the residual
// adds in the same passes: a CUDA build, a GPU, per-rank statistics and channels-last maps (or
// [N, C] matrices). Otherwise LibTorch's batch norm runs, and PReLU and the adds on their own.
bool batch_norm_runs_own_kernels(const torch::Device& device, bool synchronised,
                                 bool channels_last);
// Which kernels those are, for start-up lines.
const char* batch_norm_kernels(const torch::Device& device, bool synchronised, bool channels_last);

// What the kernels of our own did since the process began, for a bench's route line and tests:
// their statistics passes, the outputs they summed for the batch norm after them (output sums), and
// the batch norms whose backward sums the next one's backward was set to form (backward folds, set
// in forward). Zero in builds without CUDA.
struct BatchNormRouteCount {
  int64_t statistics_passes = 0;
  int64_t output_sums = 0;
  int64_t backward_folds = 0;
};
// What the kernels did between two counts.
inline BatchNormRouteCount operator-(const BatchNormRouteCount& a, const BatchNormRouteCount& b) {
  return {a.statistics_passes - b.statistics_passes, a.output_sums - b.output_sums,
          a.backward_folds - b.backward_folds};
}
BatchNormRouteCount batch_norm_route_count();

// Whether a batch norm without a slope that sums its output for the next batch norm (IResNet's bn3,
// with output sums on) lets that one's backward form its backward sums (BackwardFold): on by
// default; off for a bench's comparison (--backward-folds). Process-wide. Returns `enabled`.
bool use_backward_folds(bool enabled);
bool backward_folds_enabled();

// Whether BatchNormImpl::convolve may form the statistics in cuDNN's graph. Off unless
// --conv-statistics asks: on an H200 cuDNN's fused convolutions were slower than its timed plain
// ones. Process-wide. Returns `enabled`.
bool use_convolution_statistics(bool enabled);
// Whether this build can: LibTorch with CUDA, and cuDNN's headers and library found.
bool convolution_statistics_built();
// Which convolutions formed the statistics, for start-up and summary lines: "off", "on" before the
// first step, then "N of M shapes" with cuDNN's first refusal.
std::string convolution_statistics_state();
// The convolution shapes seen so far in this process: how many form their sums in cuDNN, how many
// it refused (with its first reason), and the seconds their plans took to build. Zero before the
// first training forward, and always in builds without cuDNN's graph API.
struct ConvolutionStatisticsReport {
  int64_t planned = 0, unplanned = 0;
  double build_seconds = 0;
  std::string first_reason;
};
ConvolutionStatisticsReport convolution_statistics_report();

// Points every BatchNorm inside `module` at `comm` (null: per-rank statistics again).
void set_batch_norm_sync(torch::nn::Module& module, Communicator* comm);

}  // namespace myriad
