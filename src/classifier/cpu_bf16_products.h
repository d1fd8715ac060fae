#pragma once

// The CPU classifier's two long matrix products, for bfloat16 operands with float32 sums, on the
// CPU's own bfloat16 pair products (AVX512-BF16's vdpbf16ps: two products and their sum per
// float32 lane). Both are shaped for a shard: many rows of classes against a small batch. Where
// the CPU has no such instruction, mixed_gemm multiplies float32 copies instead.

#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>

#include <cstdint>

namespace myriad {

// Whether this CPU runs the products below.
bool cpu_has_bf16_products();

// Whether GEMMs of `gemm_dtype` take the products below on this CPU: the one choice that the
// CPU's logits path, row updater and GEMMs share.
bool cpu_pair_products(c10::ScalarType gemm_dtype);

// out[rows, batch] = a[rows, dim] @ b[batch, dim]^T: each class row against every sample (the
// logits). All row-major and contiguous; rows are spread over LibTorch's threads.
void bf16_rows_by_batch(float* out, const c10::BFloat16* a, const c10::BFloat16* b, int64_t rows,
                        int64_t batch, int64_t dim);

// out[rows, cols] = a[rows, length] @ b[length, cols] on the calling thread, for a few rows at a
// time against a small b (a block of class rows' gradients: the logits' gradient times the
// features).
void bf16_rows_by_matrix(float* out, const c10::BFloat16* a, const c10::BFloat16* b, int64_t rows,
                         int64_t length, int64_t cols);

// out[m, n] = a[k, m]^T @ b[k, n], or out += it where `accumulate`: a sum over the k class rows
// (the features' gradient). Each thread sums a fixed slice of k and the slices are added in order,
// so a given thread count gives the same bits on every run.
void bf16_long_k(float* out, const c10::BFloat16* a, const c10::BFloat16* b, int64_t k, int64_t m,
                 int64_t n, bool accumulate);

}  // namespace myriad
