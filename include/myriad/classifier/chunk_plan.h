#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>

#include "myriad/classifier/fused_shapes.h"

namespace myriad {

// How the class rows are processed within a memory budget (design §1). With `cache`, forward
// keeps every chunk's logits and GEMM rows for backward; without it, backward recomputes them
// (one more GEMM) and only one chunk's buffers exist at a time. With `kept_exponentials` (the
// fused kernels' cached plan, for a normalising margin) forward also keeps each logit's
// exp(z - s) / |w_j| in bf16, in the bytes that the logits' gradient takes otherwise, and backward
// forms the gradient from them with no products of its own.
struct ChunkPlan {
  int64_t chunk_rows = 0;
  int64_t chunks = 0;
  bool cache = false;
  bool kept_exponentials = false;
};

// Where the GEMMs read a chunk's class rows: a copy in the GEMM dtype (normalised, or of the
// sampled rows), or the stored shard itself (stored in the GEMM dtype, every row active), which
// costs no memory beyond each row's 1/|w|.
enum class RowSource { kCopy, kStored };

// The one rule for it: the stored rows serve when the shard is stored in the GEMM dtype and every
// row takes part (no Partial FC sampling).
RowSource row_source(c10::ScalarType weight_dtype, c10::ScalarType gemm_dtype, bool sampled);

// The one rule for where SGD's row kernels write the next forward's copy of the rows as they store
// them (NextForward), so that forward makes none: a step that reads a copy of every row (no
// Partial FC) and caches its plan. The copy then stays from one step to the next, in the room of
// the rows that forward keeps for backward.
bool update_writes_copy(RowSource source, bool sampled, bool cached);

// Where a chunk's logits live: in memory, float32, between the GEMM and the softmax kernels; or
// in registers, for the fused kernels, which recompute them in backward and never store them.
enum class Logits { kInMemory, kInRegisters };

// Where the rows' gradient lives: in a chunk's buffer between the weight-gradient GEMM and the
// update, in float32 or bfloat16 (row_gradient_store), or nowhere (the fused update forms it on
// chip; a part of a step updates no rows).
enum class RowGradientStore { kFloat32, kBFloat16, kNone };

// The one rule for the chunk's buffer: where the update kernels take it (rather than a float32
// gradient that accumulates across steps) and the GEMMs multiply bfloat16, the rows' gradient takes
// the dtype of the rows it updates. For bfloat16 rows that halves the bytes that the GEMM writes
// and the update reads back; its rounding (to nearest: at most 2^-8 of each element) is smaller
// than that of the rows themselves, which round each update stochastically, by up to a bf16 step
// (2^-7 of each weight), wherever the update is smaller than twice its weight. Float32 products
// stay float32 (cuBLAS writes bfloat16 only from bfloat16 operands).
RowGradientStore row_gradient_store(c10::ScalarType weight_dtype, c10::ScalarType gemm_dtype,
                                    bool update_kernels);
c10::ScalarType row_gradient_dtype(RowGradientStore store);

// The rows that one piece of a chunk's rows' gradient spans: the update kernels' updaters form and
// apply it in pieces of at most 1/32 of the workspace `budget_bytes` (at least a row each), so
// that the gradient (2 GiB of float32 at a million rows of 512) does not set the step's peak.
int64_t row_gradient_piece_rows(int64_t budget_bytes, int64_t dim, RowGradientStore store);

// Bytes one class row costs: kept from forward to backward when cached (its logits if in memory,
// its GEMM row or 1/|w|), and in flight during backward (its logit gradients, its weight
// gradient where it is stored).
int64_t chunk_cached_bytes_per_row(int64_t batch, int64_t dim, int64_t gemm_bytes, RowSource source,
                                   Logits logits = Logits::kInMemory);
int64_t chunk_work_bytes_per_row(int64_t batch, int64_t dim, int64_t gemm_bytes,
                                 RowGradientStore row_gradient = RowGradientStore::kFloat32);

// The plan for `rows` active class rows, a global batch `batch`, embedding `dim`, GEMM operands
// of `gemm_bytes` per element read from `source`, within `budget_bytes`. Caches when everything
// fits; otherwise the largest chunk that fits, and at least one row. With the logits in
// registers a chunk spans whole tiles of kFusedTileRows classes where it can, so that only the
// last chunk's last tile is partial.
ChunkPlan plan_chunks(int64_t rows, int64_t batch, int64_t dim, int64_t gemm_bytes,
                      RowSource source, int64_t budget_bytes, Logits logits = Logits::kInMemory,
                      RowGradientStore row_gradient = RowGradientStore::kFloat32);

// Whether the fused kernels take this shape on an H100 or H200: bfloat16 GEMMs and D a multiple of
// 8 up to kFusedMaxDim. Whether a device runs them is fused_chunks_apply's question.
bool fused_kernels_take(c10::ScalarType gemm_dtype, int64_t dim);

// Whether SGD's update of the rows is formed from the logits' gradient in one kernel
// (fused_sgd_rows), where the fused kernels run SGD on bfloat16 rows: at global batches up to
// kFusedUpdateAutoMaxBatch (kAuto), at every batch the kernel takes (kOn), or never (kOff).
enum class FusedUpdate { kAuto, kOn, kOff };
// Where the fused update stops being the faster path. Against cuBLAS's GEMM writing the rows'
// gradient in bf16 and sgd_rows reading it (row_gradient_store), at 4M rows of D = 512 on an H200
// it takes 8.59 against 9.20 ms at a batch of 384 and 10.14 against 9.20 ms at 512; at 8M classes
// on 2 H200s, 256 per GPU, the step took 18.66 ms with it and 18.28 without (docs/classifier.md).
// It streams the rows once, but its products re-read the features from L2 for every tile of rows
// and wait for them, which costs it at large batches.
constexpr int64_t kFusedUpdateAutoMaxBatch = 384;
// The choice's rule for a step of global batch `batch`.
bool fused_update_chosen(FusedUpdate choice, int64_t batch);

}  // namespace myriad
