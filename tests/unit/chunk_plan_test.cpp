#include <gtest/gtest.h>

#include "myriad/classifier/chunk_plan.h"

namespace myriad {
namespace {

TEST(ChunkPlan, CachesWhenEverythingFits) {
  const int64_t per_row = chunk_cached_bytes_per_row(256, 512, 2, RowSource::kCopy) +
                          chunk_work_bytes_per_row(256, 512, 2);
  const ChunkPlan plan = plan_chunks(1000, 256, 512, 2, RowSource::kCopy, 1000 * per_row);
  EXPECT_TRUE(plan.cache);
  EXPECT_EQ(plan.chunks, 1);
  EXPECT_EQ(plan.chunk_rows, 1000);
}

TEST(ChunkPlan, ChunksWithinTheBudgetOtherwise) {
  const int64_t per_row = chunk_cached_bytes_per_row(256, 512, 2, RowSource::kCopy) +
                          chunk_work_bytes_per_row(256, 512, 2);
  const ChunkPlan plan = plan_chunks(1000, 256, 512, 2, RowSource::kCopy, 300 * per_row + 5);
  EXPECT_FALSE(plan.cache);
  EXPECT_EQ(plan.chunk_rows, 300);
  EXPECT_EQ(plan.chunks, 4);
  EXPECT_LE(plan.chunk_rows * per_row, 300 * per_row + 5);
}

TEST(ChunkPlan, StoredRowsLeaveTheBudgetToLogits) {
  // Reading the stored rows, a row costs its logits, 1/|w| and its gradients, no GEMM copy.
  const int64_t per_row = 4 * 256 + 4 + chunk_work_bytes_per_row(256, 512, 2);
  EXPECT_EQ(chunk_cached_bytes_per_row(256, 512, 2, RowSource::kStored), 4 * 256 + 4);
  const ChunkPlan plan = plan_chunks(1000, 256, 512, 2, RowSource::kStored, 300 * per_row);
  EXPECT_EQ(plan.chunk_rows, 300);
  EXPECT_GT(plan.chunk_rows,
            plan_chunks(1000, 256, 512, 2, RowSource::kCopy, 300 * per_row).chunk_rows);
}

TEST(ChunkPlan, AlwaysAtLeastOneRowAndNoChunksForNoRows) {
  EXPECT_EQ(plan_chunks(10, 64, 64, 4, RowSource::kCopy, 1).chunk_rows, 1);
  EXPECT_EQ(plan_chunks(10, 64, 64, 4, RowSource::kCopy, 1).chunks, 10);
  EXPECT_EQ(plan_chunks(0, 64, 64, 4, RowSource::kCopy, 1 << 20).chunks, 0);
}

}  // namespace
}  // namespace myriad
