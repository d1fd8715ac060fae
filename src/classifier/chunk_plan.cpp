#include "myriad/classifier/chunk_plan.h"

#include <algorithm>

namespace myriad {

RowSource row_source(c10::ScalarType weight_dtype, c10::ScalarType gemm_dtype, bool sampled) {
  return !sampled && weight_dtype == gemm_dtype ? RowSource::kStored : RowSource::kCopy;
}

int64_t chunk_cached_bytes_per_row(int64_t batch, int64_t dim, int64_t gemm_bytes,
                                   RowSource source) {
  return 4 * batch + (source == RowSource::kCopy ? gemm_bytes * dim : 4);
}

int64_t chunk_work_bytes_per_row(int64_t batch, int64_t dim, int64_t gemm_bytes) {
  return gemm_bytes * batch + 4 * dim;
}

ChunkPlan plan_chunks(int64_t rows, int64_t batch, int64_t dim, int64_t gemm_bytes,
                      RowSource source, int64_t budget_bytes) {
  ChunkPlan plan;
  const int64_t per_row = chunk_cached_bytes_per_row(batch, dim, gemm_bytes, source) +
                          chunk_work_bytes_per_row(batch, dim, gemm_bytes);
  if (rows * per_row <= budget_bytes) {
    plan.cache = true;
    plan.chunk_rows = std::max<int64_t>(rows, 1);
  } else {
    plan.chunk_rows = std::max<int64_t>(1, budget_bytes / per_row);
  }
  plan.chunks = rows == 0 ? 0 : (rows + plan.chunk_rows - 1) / plan.chunk_rows;
  return plan;
}

}  // namespace myriad
