#pragma once

// Launchers of the classifier's CUDA kernels. Plain pointers and streams only, so that this
// header and the .cu files compile without LibTorch. Each returns cudaGetLastError() after its
// launch; callers check it.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "../row_update_rule.h"
#include "myriad/classifier/margin.h"
#include "myriad/classifier/row_gradient.h"
#include "myriad/util/element_type.h"

namespace myriad::cuda {

// Logits are class-major: dot[j, b] = x_b . w_j for the chunk's classes j and the batch's
// samples b, so every GEMM operand has a short leading dimension and the kernels below read
// along the batch, coalesced.

// Classes one thread walks in chunk_stats and chunk_grad: long enough to amortise its per-sample
// setup, short enough that about half a million threads share the chunk (samples x tiles), so
// small batches still fill the GPU.
inline int64_t softmax_tile_rows(int64_t classes, int64_t batch) {
  const int64_t columns = batch % 4 == 0 ? batch / 4 : batch;
  const int64_t rows = classes * columns / (int64_t{1} << 19);
  return std::max<int64_t>(32, std::min<int64_t>(2048, rows)) / 4 * 4;
}

// Per (tile of softmax_tile_rows classes, sample b): max of z and sum of exp(z - max), into
// tile_max/tile_sum [tiles, batch]; target_logit[b] = z at b's target when its class
// (target_col[b] - begin) lies in this chunk. The cosine of (j, b) is dot[j, b] * row_scale[j]
// when row_scale is given (GEMMs on unnormalised rows), else dot[j, b].
cudaError_t chunk_stats(const float* dot, const float* row_scale, int64_t classes, int64_t batch,
                        const int64_t* target_col, int64_t begin, MarginParams params,
                        float* tile_max, float* tile_sum, float* target_logit, cudaStream_t stream);

// out[j, b] = coef * (exp(z_jb - row_max_b) * row_inv_sum_b - [j is b's target]) * dz/dcos,
// with coef read from device memory (no host synchronisation for the loss gradient). With
// row_scale, cosines are read as in chunk_stats and out[j, b] is multiplied by row_scale[j].
cudaError_t chunk_grad(const float* dot, const float* row_scale, int64_t classes, int64_t batch,
                       const int64_t* target_col, int64_t begin, const float* row_max,
                       const float* row_inv_sum, const float* coef, MarginParams params, void* out,
                       ElementType out_type, cudaStream_t stream);

// out[r] = weight[row(r)] (normalised when `normalize`) in out_type, for the `count` rows
// row(r) = index ? index[begin + r] : begin + r of a weight shard in weight_type; and
// inv_norms[r] = 1 / |weight[row(r)]|. Either output may be null.
cudaError_t prepare_rows(const void* weight, ElementType weight_type, int64_t dim,
                         const int64_t* index, int64_t begin, int64_t count, bool normalize,
                         void* out, ElementType out_type, float* inv_norms, cudaStream_t stream);

// The weight shard as the update kernels write it: float32, or bfloat16 stored with stochastic
// rounding (stochastic_round.h), element (row, k) drawing its bits from
// (rounding_seed, (first_row + row) * dim + k) so that any rank count rounds alike.
struct WeightShard {
  void* data;
  ElementType type;  // kFloat32 or kBFloat16
  int64_t first_row;
  uint64_t rounding_seed;
};

using ::myriad::SgdArgs;

// What sgd_rows may write for the next forward as it stores each row, at the row's place in the
// shard, as prepare_rows would make it: its 1/|w| (the GEMMs on the stored rows take it), and its
// copy in copy_type, normalised where `normalize` (the GEMMs on copies read it). Either may be
// null.
struct NextForwardRows {
  float* inv_norms = nullptr;
  void* copy = nullptr;
  ElementType copy_type = ElementType::kBFloat16;
  bool normalize = false;
};

// For each of `count` rows: dw from grad (taken with respect to what grad_of says), then SGD with
// momentum and weight decay on the row and its momentum buffer (momentum_type; null when momentum
// is 0). One pass over each row. `grad` is float32 or bfloat16 (grad_type). It also writes `next`
// and sets *next_written, except where its order of sums would differ from prepare_rows': there it
// writes none of it.
cudaError_t sgd_rows(WeightShard weight, void* momentum, ElementType momentum_type,
                     const void* grad, ElementType grad_type, int64_t dim, const int64_t* index,
                     int64_t begin, int64_t count, RowGradient grad_of, SgdArgs args,
                     cudaStream_t stream, const NextForwardRows& next, bool* next_written);

using ::myriad::AdamWArgs;

// AdamW on each of `count` rows, with first and second moments in state_type.
cudaError_t adamw_rows(WeightShard weight, void* exp_avg, void* exp_avg_sq, ElementType state_type,
                       const void* grad, ElementType grad_type, int64_t dim, const int64_t* index,
                       int64_t begin, int64_t count, RowGradient grad_of, AdamWArgs args,
                       cudaStream_t stream);

}  // namespace myriad::cuda
