#pragma once

// The classifier optimizer's row update on the CPU: one pass over each row, its gradient and its
// state, with the arithmetic of the GPU's row kernels (row_update_rule.h) and no temporaries of
// the shard's size (a chain of LibTorch operations took 6 s a step at 1M classes a rank).

#include <torch/types.h>

#include "row_update_rule.h"

namespace myriad {

// Rows [begin, end) of the active rows of a shard: shard rows index[i] (undefined: i itself),
// with their gradients grad[i - begin] taken with respect to what grad_of says. Given `features`,
// `grad` is the logits' gradient instead, and each row's gradient grad[i - begin] . features is
// formed in the row's pass, never stored: a GEMM would write the shard's gradient and the update
// read it back.
struct CpuRowUpdate {
  torch::Tensor weight;  // float32 or bfloat16, contiguous; updated in place
  torch::Tensor index;   // int64, or undefined
  int64_t begin = 0, end = 0;
  torch::Tensor grad;  // float32 or bfloat16 [end - begin, D] (or [end - begin, B]), contiguous
  RowGradient grad_of = RowGradient::kRow;
  // bfloat16 weights are rounded stochastically, element (row, k) drawing the bits of global
  // element (first_row + row) D + k under rounding_seed, as the GPU's stores do.
  int64_t first_row = 0;
  uint64_t rounding_seed = 0;
  // float32 or bfloat16 [B, D], contiguous, or undefined. Their dtype picks how the rows'
  // gradients are formed: float32 in each row's pass, or bfloat16 by the CPU's bf16 pair products
  // (a bfloat16 `grad`, and a CPU that has them: cpu_has_bf16_products).
  torch::Tensor features;
};

// SGD on the rows, with their momentum buffers (float32 or bfloat16, the weight's shape;
// undefined when momentum is 0).
void sgd_rows_cpu(const CpuRowUpdate& rows, torch::Tensor& momentum, const SgdArgs& args);

// AdamW on the rows, with their moments (float32 or bfloat16, the weight's shape).
void adamw_rows_cpu(const CpuRowUpdate& rows, torch::Tensor& exp_avg, torch::Tensor& exp_avg_sq,
                    const AdamWArgs& args);

}  // namespace myriad
