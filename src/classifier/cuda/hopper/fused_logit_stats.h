#pragma once

// The fused forward of the margin softmax for Hopper GPUs (sm_90a): per group of classes and
// sample, the max of the logits and the sum of their exponentials, without writing the logits.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "myriad/classifier/margin.h"

namespace myriad::cuda {

// Embeddings up to this width keep a CTA's 128 rows of x̂ in shared memory.
constexpr int kFusedMaxDim = 512;

// Whether `device` runs the fused kernels for `dim`-wide embeddings: compute capability 9.0,
// dim a multiple of 8 and at most kFusedMaxDim.
bool fused_logit_stats_applies(int device, int dim);

// Groups of tiles_per_group x 128 classes that `classes` make.
int64_t fused_logit_groups(int64_t classes, int tiles_per_group);

// x: bf16 [batch, dim] (rows normalised), w: bf16 [classes, dim] with row_scale[j] = 1/|w_j| (or
// null when w's rows are normalised). For every group g and sample b: group_max[g, b] and
// group_sum[g, b], the max of z over the group's classes and the sum of exp(z - max);
// target_logit[b] = z at b's target when target_col[b] - begin lies in [0, classes).
cudaError_t fused_logit_stats(const void* x, int64_t batch, const void* w, const float* row_scale,
                              int64_t classes, int dim, const int64_t* target_col, int64_t begin,
                              MarginParams params, int tiles_per_group, float* group_max,
                              float* group_sum, float* target_logit, cudaStream_t stream);

}  // namespace myriad::cuda
