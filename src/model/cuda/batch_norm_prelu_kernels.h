#pragma once

// Launchers of the fused batch norm + PReLU kernels (BatchNormImpl::forward_prelu). Plain pointers
// and streams only, so that this header and the .cu file compile without LibTorch. Each returns
// cudaGetLastError() after its launches; callers check it.
//
// The data are `rows` x `channels` elements with the channel moving fastest: a channels-last
// [N, C, H, W] map (rows = N H W) or an [N, C] matrix. Per channel c the kernels read mean[c] and
// invstd[c] (the batch statistics), gamma[c] and beta[c] (batch norm's affine parameters) and
// alpha[c * alpha_stride] (PReLU's slope: alpha_stride 1 per channel, 0 for one shared slope):
//   x̂ = (x - mean) invstd,   z = gamma x̂ + beta,   y = z > 0 ? z : alpha z.

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

// y from x.
cudaError_t batch_norm_prelu_forward(const void* x, void* y, ElementType type, int64_t rows,
                                     int64_t channels, BatchNormPReLUParams p, cudaStream_t stream);

// Per channel, over the rows, given dy (the gradient of y): sums[c] = Σ dz,
// sums[channels + c] = Σ dz x̂ and sums[2 channels + c] = Σ dy z [z <= 0], where
// dz = z > 0 ? dy : alpha dy is the gradient of z: the gradients of beta, gamma and alpha,
// `sums` [3, channels] float32. Blocks of rows sum into `partials` (batch_norm_prelu_partials
// floats), which are then added in a fixed order: no atomics, so the sums are the same bits at
// every run (--deterministic).
int64_t batch_norm_prelu_partials(int64_t channels);
cudaError_t batch_norm_prelu_backward_reduce(const void* x, const void* dy, ElementType type,
                                             int64_t rows, int64_t channels, BatchNormPReLUParams p,
                                             float* partials, float* sums, cudaStream_t stream);

// dx = gamma invstd (dz - Σ dz / rows - x̂ Σ dz x̂ / rows), with the sums of
// batch_norm_prelu_backward_reduce.
cudaError_t batch_norm_prelu_backward_input(const void* x, const void* dy, void* dx,
                                            ElementType type, int64_t rows, int64_t channels,
                                            BatchNormPReLUParams p, const float* sums,
                                            cudaStream_t stream);

}  // namespace myriad::cuda
