#pragma once

// SGD on the classifier's rows with their gradient formed on the tensor cores and used in
// registers: the float32 gradient [rows, D] that cuBLAS's weight-gradient GEMM wrote and the
// update read back never reaches memory. Hopper (sm_90a) only, beside fused_softmax.h.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "../kernels.h"
#include "fused_softmax.h"

namespace myriad::cuda {

// Whether fused_sgd_rows takes a batch of `batch` rows of width `dim` (the bulk copies need rows
// of whole 16-byte units, and a CTA holds at most kFusedMaxDim columns of a row).
bool fused_sgd_rows_take(int64_t batch, int dim);

// For each of `count` chunk rows r, shard row row(r) = index ? index[begin + r] : begin + r:
// g_r = sum over b of logit_grad[r, b] x_b, from logit_grad bf16 class-major [count, batch] (as
// fused_logit_grad writes it) and xt = x transposed, bf16 [dim, batch]; then sgd_rows' update of
// row(r) with g_r: the same row gradient, momentum, weight decay, Nesterov and multiplier, and
// the same bits of stochastic rounding. Deterministic: fixed reduction orders, no atomics.
cudaError_t fused_sgd_rows(WeightShard weight, void* momentum, ElementType momentum_type,
                           const void* logit_grad, const void* xt, int64_t batch, int dim,
                           const int64_t* index, int64_t begin, int64_t count, RowGradient grad_of,
                           SgdArgs args, cudaStream_t stream);

}  // namespace myriad::cuda
