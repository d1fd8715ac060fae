#pragma once

#include <torch/types.h>

namespace myriad {

// Matrix products with float32 output and float32 accumulation from float32, bfloat16 or float16
// operands, so logits stay float32 whatever the GEMM precision (LibTorch's matmul returns its
// inputs' dtype). Row-major, contiguous operands of one dtype; `out` is contiguous float32.

// out = op(a) @ op(b), or out += op(a) @ op(b) when `accumulate`; here `out` may also be
// bfloat16 where the operands are (the rows' gradient of bfloat16 rows, row_gradient_store),
// rounded to nearest once from the float32 sums.
void gemm_f32(torch::Tensor& out, const torch::Tensor& a, bool trans_a, const torch::Tensor& b,
              bool trans_b, bool accumulate);

// out[M, N] (+)= a^T @ b for a [K, M] and b [K, N] with K much larger than M and N (a chunk of
// classes times the batch, reduced over the classes). One cuBLAS call would cover the small
// output with a few tiles and leave most of the GPU idle, so K is cut into slices multiplied in
// one batched call and then summed.
void gemm_f32_long_k(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b,
                     bool accumulate);

}  // namespace myriad
