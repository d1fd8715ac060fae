#include "myriad/classifier/chunk_plan.h"

#include <algorithm>

#include "myriad/util/error.h"

namespace myriad {

RowSource row_source(c10::ScalarType weight_dtype, c10::ScalarType gemm_dtype, bool sampled) {
  return !sampled && weight_dtype == gemm_dtype ? RowSource::kStored : RowSource::kCopy;
}

bool update_writes_copy(RowSource source, bool sampled, bool cached) {
  return source == RowSource::kCopy && !sampled && cached;
}

bool fused_kernels_take(c10::ScalarType gemm_dtype, int64_t dim) {
  return gemm_dtype == c10::ScalarType::BFloat16 && fused_dim_fits(dim);
}

bool fused_update_chosen(FusedUpdate choice, int64_t batch) {
  return choice == FusedUpdate::kOn ||
         (choice == FusedUpdate::kAuto && batch <= kFusedUpdateAutoMaxBatch);
}

int64_t chunk_cached_bytes_per_row(int64_t batch, int64_t dim, int64_t gemm_bytes, RowSource source,
                                   Logits logits) {
  return (logits == Logits::kInMemory ? 4 * batch : 0) +
         (source == RowSource::kCopy ? gemm_bytes * dim : 4);
}

int64_t chunk_work_bytes_per_row(int64_t batch, int64_t dim, int64_t gemm_bytes,
                                 RowGradientStore row_gradient) {
  return gemm_bytes * batch +
         (row_gradient == RowGradientStore::kNone
              ? 0
              : static_cast<int64_t>(c10::elementSize(row_gradient_dtype(row_gradient))) * dim);
}

RowGradientStore row_gradient_store(c10::ScalarType weight_dtype, c10::ScalarType gemm_dtype,
                                    bool update_kernels) {
  return update_kernels && weight_dtype == c10::ScalarType::BFloat16 &&
                 gemm_dtype == c10::ScalarType::BFloat16
             ? RowGradientStore::kBFloat16
             : RowGradientStore::kFloat32;
}

c10::ScalarType row_gradient_dtype(RowGradientStore store) {
  MYRIAD_CHECK(store != RowGradientStore::kNone, "no rows' gradient is stored");
  return store == RowGradientStore::kBFloat16 ? c10::ScalarType::BFloat16 : c10::ScalarType::Float;
}

int64_t row_gradient_piece_rows(int64_t budget_bytes, int64_t dim, RowGradientStore store) {
  const int64_t row_bytes = dim * static_cast<int64_t>(c10::elementSize(row_gradient_dtype(store)));
  return std::max<int64_t>(1, budget_bytes / 32 / std::max<int64_t>(row_bytes, 1));
}

ChunkPlan plan_chunks(int64_t rows, int64_t batch, int64_t dim, int64_t gemm_bytes,
                      RowSource source, int64_t budget_bytes, Logits logits,
                      RowGradientStore row_gradient) {
  ChunkPlan plan;
  const int64_t per_row = chunk_cached_bytes_per_row(batch, dim, gemm_bytes, source, logits) +
                          chunk_work_bytes_per_row(batch, dim, gemm_bytes, row_gradient);
  if (rows * per_row <= budget_bytes) {
    plan.cache = true;
    plan.chunk_rows = std::max<int64_t>(rows, 1);
  } else {
    plan.chunk_rows = std::max<int64_t>(1, budget_bytes / per_row);
    if (logits == Logits::kInRegisters && plan.chunk_rows > kFusedTileRows)
      plan.chunk_rows -= plan.chunk_rows % kFusedTileRows;
  }
  plan.chunks = rows == 0 ? 0 : (rows + plan.chunk_rows - 1) / plan.chunk_rows;
  return plan;
}

}  // namespace myriad
