#pragma once

// SGD on the classifier's rows with their gradient formed on the tensor cores and used in
// registers: the float32 gradient [rows, D] that cuBLAS's weight-gradient GEMM wrote and the
// update read back never reaches memory. Hopper (sm_90a) only, beside fused_softmax.h.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../kernels.h"
#include "fused_softmax.h"
#include "myriad/classifier/fused_shapes.h"

namespace myriad::cuda {

// Whether fused_sgd_rows takes a batch of `batch` rows of width `dim` stored as `weight_type`
// (the bulk copies need rows of whole 16-byte units, a cluster holds at most kFusedMaxDim
// columns of a row, and shared memory holds a tile of bf16 rows, not of float32 ones).
bool fused_sgd_rows_take(int64_t batch, int dim, ElementType weight_type);

// The features as fused_sgd_rows reads them: x transposed, bf16 [fused_sgd_rows_xt_rows(dim),
// batch], its row p holding column fused_sgd_rows_column(p) of x, or zeros where that is not
// below dim. Within each 32 columns the order swaps the two 2-bit fields above a column's lowest
// bit (8 a + 2 b + e holds column 8 b + 2 a + e), which puts 8 neighbouring columns of a row in
// the registers of one thread of the wgmma accumulators' layout. The order is its own inverse.
constexpr int fused_sgd_rows_xt_rows(int dim) {
  return (dim + 31) / 32 * 32;
}
constexpr int fused_sgd_rows_column(int p) {
  return (p & ~31) | (((p >> 1) & 3) << 3) | (((p >> 3) & 3) << 1) | (p & 1);
}

// For each of `count` chunk rows r, shard row row(r) = index ? index[begin + r] : begin + r:
// g_r = sum over b of logit_grad[r, b] x_b, from logit_grad bf16 class-major [count, batch] (as
// fused_logit_grad writes it) and xt as above; then sgd_rows' update of
// row(r) with g_r: the same row gradient, momentum, weight decay, Nesterov and multiplier, and
// the same bits of stochastic rounding. Deterministic: fixed reduction orders, no atomics.
cudaError_t fused_sgd_rows(WeightShard weight, void* momentum, ElementType momentum_type,
                           const void* logit_grad, const void* xt, int64_t batch, int dim,
                           const int64_t* index, int64_t begin, int64_t count, RowGradient grad_of,
                           SgdArgs args, cudaStream_t stream);

}  // namespace myriad::cuda
