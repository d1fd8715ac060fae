#pragma once

// The per-chunk steps of the sharded margin softmax. A chunk is rows [begin, end) of the active
// class rows (the whole shard, or the rows Partial FC sampled, listed by `index`). Logits are
// class-major, dot[j, b] = x_b . w_j, [chunk classes, batch]: every GEMM operand then has a short
// leading dimension and the kernels read along the batch. Each step runs as fused CUDA kernels on
// the GPU and as LibTorch operations on the CPU; both compute the same function, with the margin
// from margin.h.

#include <torch/types.h>

#include "cpu_softmax.h"
#include "myriad/classifier/margin.h"

namespace myriad {

// The chunk's weight rows (float32 or bfloat16) as GEMM operand: normalised when `normalize`, in
// `dtype`.
// `index` is undefined for contiguous rows of `weight`.
torch::Tensor prepare_chunk_rows(const torch::Tensor& weight, const torch::Tensor& index,
                                 int64_t begin, int64_t end, torch::ScalarType dtype,
                                 bool normalize);

// 1 / |w| of contiguous rows [begin, end) of `weight`, [end - begin] float32: the scale of the
// logits of GEMMs that read the stored rows directly.
torch::Tensor chunk_inv_norms(const torch::Tensor& weight, int64_t begin, int64_t end);

// Folds one chunk of logits `dot` [c, B] into running per-sample statistics: `row_max` and
// `row_sum` (sum of exp(z - row_max)), and writes the target logit of samples whose target
// class (`target_col` - begin) lies in the chunk into `target_logit`. The cosines are
// dot * row_scale[j] when `row_scale` [c] is defined, else dot. On the CPU, `kept` (its `exps`
// allocated) keeps the chunk's exponentials for cpu_kept_grad.
void accumulate_chunk_stats(const torch::Tensor& dot, const torch::Tensor& row_scale,
                            const torch::Tensor& target_col, int64_t begin,
                            const MarginParams& params, torch::Tensor& row_max,
                            torch::Tensor& row_sum, torch::Tensor& target_logit,
                            CpuKeptExponentials* kept = nullptr);

// d loss / d cos for one chunk, [c, B]: coef * (softmax - one_hot) * dz/dcos, in `dtype`, times
// row_scale[j] when it is defined (cosines read as in accumulate_chunk_stats). `coef` is a
// one-element float32 tensor on the logits' device (incoming gradient over batch size).
torch::Tensor chunk_logit_grad(const torch::Tensor& dot, const torch::Tensor& row_scale,
                               const torch::Tensor& target_col, int64_t begin,
                               const torch::Tensor& row_max, const torch::Tensor& row_inv_sum,
                               const torch::Tensor& coef, const MarginParams& params,
                               torch::ScalarType dtype);

// Whether the fused Hopper kernels (cuda/hopper/fused_softmax.h) run this classifier: a GPU of
// compute capability 9.0 in a build that has them, bfloat16 GEMMs, and an embedding size that
// is a multiple of 8 up to 512. They take the place of the logits' GEMM with
// accumulate_chunk_stats in forward, and of the recomputed GEMM with chunk_logit_grad in
// backward, on the same operands; the logits never reach memory.
bool fused_chunks_apply(const torch::Device& device, int64_t dim, torch::ScalarType gemm_dtype);

// What forward keeps for backward where the plan keeps the exponentials: `matrix` bfloat16
// [c, B], exp(z - r_b) / |w_j| per logit, and each sample's target cosine `target_cos` [B] where
// its target lies in the chunk. `reference` [B] float32 holds r_b, a bound on sample b's logits: s
// for a normalising margin, logit_bounds for plain softmax.
struct KeptExponentials {
  torch::Tensor matrix;
  torch::Tensor target_cos;
  torch::Tensor reference;
};

// A bound on every logit of plain softmax per sample, |x_b| max_j |w_j| (Cauchy-Schwarz), from the
// float32 features `x` [B, D] and the rows' 1/|w_j| `inv_norms`, so that no kept exponential
// overflows. The GEMMs read x rounded to their dtype, which may exceed the bound by that rounding:
// exp of a few units, far from bfloat16's range.
torch::Tensor logit_bounds(const torch::Tensor& x, const torch::Tensor& inv_norms);

// accumulate_chunk_stats from the operands: `x` [B, D] and `rows` [c, D], bfloat16; with `kept`,
// also fills it (allocated by the caller).
void accumulate_fused_chunk_stats(const torch::Tensor& x, const torch::Tensor& rows,
                                  const torch::Tensor& row_scale, const torch::Tensor& target_col,
                                  int64_t begin, const MarginParams& params, torch::Tensor& row_max,
                                  torch::Tensor& row_sum, torch::Tensor& target_logit,
                                  KeptExponentials* kept = nullptr);

// Backward from the kept exponentials of the chunk of `rows` against `x`, given the global
// statistics: replaces each target's element by its gradient (margin included) over the sample's
// factor, and returns the factors [B] float32, so that the logits' gradient is
// kept.matrix[j, b] * factor[b] everywhere. Where a row's max lies deeper than kKeptMaxDepth below
// its reference, elements that matter may have underflowed: then, decided on the device with no
// host synchronisation, the recomputed gradient overwrites kept.matrix and every factor is 1.
torch::Tensor finish_kept_exponentials(KeptExponentials& kept, const torch::Tensor& x,
                                       const torch::Tensor& rows, const torch::Tensor& row_scale,
                                       const torch::Tensor& target_col, int64_t begin,
                                       const torch::Tensor& row_max,
                                       const torch::Tensor& row_inv_sum, const torch::Tensor& coef,
                                       const MarginParams& params);

// chunk_logit_grad from the operands, in bfloat16.
torch::Tensor fused_chunk_logit_grad(const torch::Tensor& x, const torch::Tensor& rows,
                                     const torch::Tensor& row_scale,
                                     const torch::Tensor& target_col, int64_t begin,
                                     const torch::Tensor& row_max, const torch::Tensor& row_inv_sum,
                                     const torch::Tensor& coef, const MarginParams& params);

}  // namespace myriad
