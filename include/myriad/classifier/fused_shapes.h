#pragma once

// The shapes the fused Hopper kernels take, in one place for the kernels themselves (compiled by
// nvcc, so this header needs no torch), the chunk plan, the classifier and the step model.

#include <cstdint>

namespace myriad {

// Classes per tile of the fused softmax kernels: the chunk plan cuts chunks in whole tiles.
constexpr int64_t kFusedTileRows = 128;
// Their widest embedding: a CTA keeps its 128 rows of x̂ in shared memory.
constexpr int64_t kFusedMaxDim = 512;

// Embeddings the fused kernels take: rows of whole 16-byte units for the bulk tensor copies, up
// to kFusedMaxDim.
constexpr bool fused_dim_fits(int64_t dim) {
  return dim > 0 && dim % 8 == 0 && dim <= kFusedMaxDim;
}

// Global batches the fused weight update takes: the logits' gradient [rows, batch] that it copies
// in also needs rows of whole 16-byte units, and its coordinates are 32-bit.
constexpr bool fused_update_batch_fits(int64_t batch) {
  return batch > 0 && batch % 8 == 0 && batch < (int64_t{1} << 31);
}

// Forward keeps exp(z - r) per logit for backward, against a reference r that bounds the row's
// logits (s, or plain softmax's |x| max |w|), and backward uses them only where every row's max
// logit lies within this much of r: then every element within 27 of its row's max (a softmax share
// above e^-27 of the largest) is a normal bfloat16; what may underflow weighs less than 2e-12 of
// the row's largest gradient. Deeper rows (cosines all below 1 - 60/s, say) make backward
// recompute the logits.
constexpr float kKeptMaxDepth = 60.0f;

}  // namespace myriad
