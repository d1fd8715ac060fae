#pragma once

// Launchers of the batch norm (+ PReLU, + a residual) kernels (BatchNormImpl::forward,
// forward_prelu, forward_add and forward_fork). Plain pointers and streams only, so that this
// header and the .cu file compile without LibTorch. Each returns cudaGetLastError() after its
// launches; callers check it.
//
// The data are `rows` x `channels` elements with the channel moving fastest: a channels-last
// [N, C, H, W] map (rows = N H W) or an [N, C] matrix. Per channel c the kernels read mean[c] and
// invstd[c] (the batch statistics), gamma[c] and beta[c] (batch norm's affine parameters) and
// alpha[c * alpha_stride] (PReLU's slope: alpha_stride 1 per channel, 0 for one shared slope;
// alpha null for batch norm alone, a slope of 1):
//   x̂ = (x - mean) invstd,   z = gamma x̂ + beta,   y = z > 0 ? z : alpha z.
//
// Reductions over rows (the statistics, the parameters' gradients, an output's sums) sum blocks of
// rows into `partials` (batch_norm_partials floats), which are then added in a fixed order: no
// atomics, so every result is the same bits at every run (--deterministic).

#include <cuda_runtime_api.h>

#include <cstdint>

#include "myriad/util/element_type.h"

namespace myriad::cuda {

struct BatchNormPReLUParams {
  const float* mean;
  const float* invstd;
  const float* gamma;
  const float* beta;
  const float* alpha;
  int alpha_stride;
};

int64_t batch_norm_partials(int64_t channels);

// What a batch norm keeps across batches, updated as LibTorch's batch norm updates it (batches is
// num_batches_tracked), by the kernel that finishes the statistics, so that counting costs no
// launch of its own. Null members are left alone (a recomputation passes none).
struct RunningStatistics {
  float* mean = nullptr;
  float* var = nullptr;
  int64_t* batches = nullptr;
};

// The batch statistics of x: mean[c] and invstd[c] = 1 / sqrt(var[c] + eps) with the biased
// variance, and the running statistics updated. rows >= 2.
cudaError_t batch_norm_statistics(const void* x, ElementType type, int64_t rows, int64_t channels,
                                  float eps, float momentum, float* partials, float* mean,
                                  float* invstd, RunningStatistics running, cudaStream_t stream);

// The same statistics (and running statistics) from per-channel sums that another kernel formed
// as it wrote x: `sums` [blocks, 2, channels] float32, over blocks of rows, Σ (x - shift[c]) and
// Σ (x - shift[c])², shift null for 0 (a convolution's epilogue). The variance's difference of
// squares is taken in double precision, as cuDNN's own batch-norm fusions take it. Double cannot
// restore what float32 sums lost: our kernels shift by a row of x so that a channel whose mean is
// far above its spread keeps its variance; cuDNN's unshifted sums are held to their own bound.
// rows >= 2.
cudaError_t batch_norm_statistics_from_sums(const float* sums, const float* shift, int64_t blocks,
                                            int64_t rows, int64_t channels, float eps,
                                            float momentum, float* mean, float* invstd,
                                            RunningStatistics running, cudaStream_t stream);

// Where the forward pass also forms its output's sums, for the batch norm that reads the output
// next (batch_norm_statistics_from_sums): `partials` (batch_norm_partials floats) receives
// [blocks, 2, channels], the sums of y as stored less y's first row, and that row, the shift
// [channels], at partials + batch_norm_shift_offset(channels). The launch sets `blocks`.
struct OutputSums {
  float* partials = nullptr;
  int64_t blocks = 0;
};
int64_t batch_norm_shift_offset(int64_t channels);

// y from x, plus `residual` (of x's type and layout) where it is not null, and y's sums where
// `sums` is not null.
cudaError_t batch_norm_prelu_forward(const void* x, const void* residual, void* y, ElementType type,
                                     int64_t rows, int64_t channels, BatchNormPReLUParams p,
                                     OutputSums* sums, cudaStream_t stream);

// Per channel, over the rows, given dy (the gradient of y): sums[c] = Σ dz,
// sums[channels + c] = Σ dz x̂ and sums[2 channels + c] = Σ dy z [z <= 0], where
// dz = z > 0 ? dy : alpha dy is the gradient of z: the gradients of beta, gamma and alpha,
// `sums` [3, channels] float32.
cudaError_t batch_norm_prelu_backward_reduce(const void* x, const void* dy, ElementType type,
                                             int64_t rows, int64_t channels, BatchNormPReLUParams p,
                                             float* partials, float* sums, cudaStream_t stream);

// Where the pass that writes dx also forms the backward sums of the batch norm whose output x is
// (one without a slope, whose dy is then this dx: IResNet's bn3), so that its backward makes no
// pass over its dy: `input` is that batch norm's input, of x's type and layout, and mean and
// invstd its statistics; `partials` (batch_norm_partials floats) and `sums` [2, channels] receive
// Σ dy and Σ dy x̂ of that batch norm, batch_norm_prelu_backward_reduce's first two sums.
struct FoldedSums {
  const void* input = nullptr;
  const float* mean = nullptr;
  const float* invstd = nullptr;
  float* partials = nullptr;
  float* sums = nullptr;
};

// dx = gamma invstd (dz - Σ dz / rows - x̂ Σ dz x̂ / rows), with the sums of
// batch_norm_prelu_backward_reduce, plus dbranch (of x's type and layout) where it is not null:
// the gradient of x's other use, where x also feeds a residual block's shortcut. With the folded
// batch norm's sums where `fold` is not null.
cudaError_t batch_norm_prelu_backward_input(const void* x, const void* dy, const void* dbranch,
                                            void* dx, ElementType type, int64_t rows,
                                            int64_t channels, BatchNormPReLUParams p,
                                            const float* sums, const FoldedSums* fold,
                                            cudaStream_t stream);

}  // namespace myriad::cuda
