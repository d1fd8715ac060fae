#pragma once

// The per-chunk softmax on the CPU over class-major logits [classes, batch], built as the CUDA
// kernels are (cuda/softmax_kernels.cu): the samples across vector lanes, one pass over the logits
// for the statistics and one for the gradient, where chains of LibTorch operations made about ten
// passes and as many temporaries of the chunk's size.

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "myriad/classifier/margin.h"

namespace myriad {

// A chunk's logits as its GEMM wrote them, and what makes margin logits of them.
struct CpuChunkLogits {
  torch::Tensor dot;         // float32 [rows, batch], contiguous
  torch::Tensor row_scale;   // float32 [rows], or undefined: the cosines are dot * row_scale[j]
  torch::Tensor target_col;  // int64 [batch]: each sample's target row in the shard's active rows
  int64_t begin = 0;         // the chunk's first row there
  MarginParams params;
};

// The samples whose target lies in a chunk: its row there (else -1), its margin logit and
// dz/dcos (margin_target, as on the GPU).
struct CpuTargets {
  std::vector<int32_t> row;
  std::vector<float> z, dz_dcos;
};

// What forward keeps of a chunk for backward in place of its logits, where the plan caches: each
// logit's exp(z - the largest in its tile of rows), which backward turns into the gradient in
// place with no exponential of its own.
struct CpuKeptExponentials {
  torch::Tensor exps;      // float32 [rows, batch]
  torch::Tensor tile_max;  // float32 [tiles, batch]
  torch::Tensor row_scale;
  CpuTargets targets;
};

// Each sample's largest logit and sum of exp(z - max) per tile of rows, returned as `tile_max`
// and `tile_sum` [tiles, batch]; the logits of the targets that lie in the chunk go to
// `target_logit` [batch]. With `kept` (its `exps` allocated), the sum's pass also keeps the
// exponentials, and the rest of `kept` is filled in.
void cpu_chunk_stats(const CpuChunkLogits& chunk, torch::Tensor& tile_max, torch::Tensor& tile_sum,
                     torch::Tensor& target_logit, CpuKeptExponentials* kept = nullptr);

// The gradient of the logits' dot products, [rows, batch] in `dtype` (float32 or bfloat16):
// coef (softmax - one-hot) dz/dcos, times the row scale, given each sample's `row_max` and
// `row_inv_sum` [batch].
torch::Tensor cpu_chunk_grad(const CpuChunkLogits& chunk, const torch::Tensor& row_max,
                             const torch::Tensor& row_inv_sum, float coef, torch::ScalarType dtype);

// The same gradient from the kept exponentials, written over them in float32 and then converted
// to `dtype`: each softmax is its exponential times its tile's exp(max - row_max) / sum, within a
// few float32 roundings of cpu_chunk_grad's. (A target whose softmax nears 1 is its tile's
// largest logit, whose kept exponential is exactly 1: no cancellation in softmax - 1.)
torch::Tensor cpu_kept_grad(CpuKeptExponentials& kept, const MarginParams& params,
                            const torch::Tensor& row_max, const torch::Tensor& row_inv_sum,
                            float coef, torch::ScalarType dtype);

}  // namespace myriad
