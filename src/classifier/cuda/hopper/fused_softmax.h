#pragma once

// The fused kernels of the sharded margin softmax for Hopper GPUs (sm_90a): the logits x̂·Ŵᵀ are
// computed tile by tile on the tensor cores and used in registers, never written. Forward: per
// part of the classes and per sample, the max of the logits and the sum of their exponentials.
// Backward: the logits' gradient, recomputed from the global statistics, or formed from the
// exponentials that forward kept.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "myriad/classifier/fused_shapes.h"
#include "myriad/classifier/margin.h"

namespace myriad::cuda {

// Whether `device` runs the fused kernels: compute capability 9.0 (H100, H200). The shapes they
// take are fused_kernels_take's rule (chunk_plan.h).
bool fused_softmax_runs_on(int device);

// How many parts of the classes fused_logit_stats reports for this shape on `device`: rows of
// group_max and group_sum.
int fused_logit_parts(int device, int64_t batch, int64_t classes);

// x: bf16 [batch, dim] (rows normalised), w: bf16 [classes, dim] with row_scale[j] = 1/|w_j| (or
// null when w's rows are normalised or the softmax is plain). For every part p and sample b:
// group_max[p, b] and group_sum[p, b], the max of z over the part's classes and the sum of
// exp(z - max); target_logit[b] = z at b's target when target_col[b] - begin lies in
// [0, classes). Runs on the current device, with fused_logit_parts(that device, batch, classes)
// parts. With `kept`, also kept[j, b] = exp(z - r_b) row_scale[j] in bf16, class-major
// [classes, batch], and target_cos[b] = the target's cosine where target_logit is written. The
// reference r_b = reference[b] (float32 [batch] on the device, required) bounds sample b's
// logits: s for a normalising margin, |x_b| max_j |w_j| for plain softmax.
cudaError_t fused_logit_stats(const void* x, int64_t batch, const void* w, const float* row_scale,
                              int64_t classes, int dim, const int64_t* target_col, int64_t begin,
                              MarginParams params, float* group_max, float* group_sum,
                              float* target_logit, float* target_cos, void* kept,
                              const float* reference, cudaStream_t stream);

// The logits' gradient as chunk_grad computes it from stored logits: logit_grad[j, b] (bf16,
// class-major [classes, batch]) = coef (softmax - one-hot) dz/dcos row_scale[j], with the
// softmax from the global row_max and row_inv_sum [batch]; coef is one float on the device. With
// `gate` (one int on the device), the kernel writes nothing where *gate is 0.
cudaError_t fused_logit_grad(const void* x, int64_t batch, const void* w, const float* row_scale,
                             int64_t classes, int dim, const int64_t* target_col, int64_t begin,
                             const float* row_max, const float* row_inv_sum, const float* coef,
                             MarginParams params, void* logit_grad, const int* gate,
                             cudaStream_t stream);

// Backward from the kept exponentials, against the references fused_logit_stats kept them by
// (`reference`, required). For every sample b: factor[b] = coef u exp(r_b - row_max[b])
// row_inv_sum[b], u = dz/dcos off the target (s, or 1 for plain softmax), so that the logits'
// gradient off the target is kept[j, b] factor[b]; and where b's target lies in the chunk,
// kept[target, b] becomes its gradient (margin included) over factor[b]. Kept elements that matter
// may have underflowed where a row's max lies deeper than kKeptMaxDepth below r_b: then *deep (one
// int on the device) becomes 1 and every factor 1, and the caller runs fused_logit_grad gated on
// *deep into `kept`. Otherwise *deep becomes 0. No host synchronisation either way.
cudaError_t kept_finish(void* kept, int64_t batch, int64_t classes, const float* row_scale,
                        const int64_t* target_col, int64_t begin, const float* target_cos,
                        const float* row_max, const float* row_inv_sum, const float* coef,
                        const float* reference, MarginParams params, float* factor, int* deep,
                        cudaStream_t stream);

}  // namespace myriad::cuda
