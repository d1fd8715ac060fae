#include <gtest/gtest.h>

#include "myriad/classifier/chunk_plan.h"

#include <torch/types.h>

#include "myriad/util/error.h"

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

TEST(ChunkPlan, RowsWithoutAStoredGradientTakeOnlyTheirLogitsBytes) {
  // The fused update forms the rows' gradient on chip: at batch 256 on stored bf16 rows a row
  // costs 1/|w| and its logits' gradient, 4 + 2 * 256 bytes, not 4 * 512 more.
  EXPECT_EQ(chunk_work_bytes_per_row(256, 512, 2, RowGradientStore::kNone), 2 * 256);
  EXPECT_EQ(chunk_work_bytes_per_row(256, 512, 2), 2 * 256 + 4 * 512);
  const int64_t budget = 1000 * (4 + 2 * 256);
  const ChunkPlan whole = plan_chunks(1000, 256, 512, 2, RowSource::kStored, budget,
                                      Logits::kInRegisters, RowGradientStore::kNone);
  EXPECT_TRUE(whole.cache);
  EXPECT_EQ(whole.chunks, 1);
  const ChunkPlan stored =
      plan_chunks(1000, 256, 512, 2, RowSource::kStored, budget, Logits::kInRegisters);
  EXPECT_FALSE(stored.cache);
  EXPECT_EQ(stored.chunk_rows, 128);  // 516000 / 2564 = 201, in whole tiles
}

TEST(ChunkPlan, BFloat16RowsTakeTheirGradientInBFloat16WhereTheUpdateKernelsRun) {
  const auto bf16 = torch::kBFloat16, f32 = torch::kFloat32;
  EXPECT_EQ(row_gradient_store(bf16, bf16, true), RowGradientStore::kBFloat16);
  EXPECT_EQ(row_gradient_store(f32, bf16, true), RowGradientStore::kFloat32);
  // Float32 products, and a gradient accumulated across steps (kAccumulateGrad), stay float32.
  EXPECT_EQ(row_gradient_store(bf16, f32, true), RowGradientStore::kFloat32);
  EXPECT_EQ(row_gradient_store(bf16, torch::kFloat16, true), RowGradientStore::kFloat32);
  EXPECT_EQ(row_gradient_store(bf16, bf16, false), RowGradientStore::kFloat32);
  EXPECT_EQ(row_gradient_dtype(RowGradientStore::kBFloat16), torch::kBFloat16);
  EXPECT_EQ(row_gradient_dtype(RowGradientStore::kFloat32), torch::kFloat32);
  EXPECT_THROW(row_gradient_dtype(RowGradientStore::kNone), Error);
  // At batch 1024 and D = 512 on stored bf16 rows: 4 + 2 * 1024 + 2 * 512 bytes a row, not
  // 4 * 512 for the gradient; the same budget holds more rows per chunk.
  EXPECT_EQ(chunk_work_bytes_per_row(1024, 512, 2, RowGradientStore::kBFloat16),
            2 * 1024 + 2 * 512);
  const int64_t budget = 1000 * (4 + 2 * 1024 + 2 * 512);
  const ChunkPlan whole = plan_chunks(1000, 1024, 512, 2, RowSource::kStored, budget,
                                      Logits::kInRegisters, RowGradientStore::kBFloat16);
  EXPECT_TRUE(whole.cache);
  EXPECT_FALSE(plan_chunks(1000, 1024, 512, 2, RowSource::kStored, budget, Logits::kInRegisters,
                           RowGradientStore::kFloat32)
                   .cache);
}

TEST(ChunkPlan, LogitsInRegistersLeaveTheirBytesToRowsInWholeTiles) {
  // The fused kernels keep no logits: a row costs its GEMM row (kept when cached), its logit
  // gradients and its weight gradient, 2 * 512 + 2 * 1024 + 4 * 512 bytes at batch 1024.
  const int64_t per_row = 2 * 512 + 2 * 1024 + 4 * 512;
  EXPECT_EQ(chunk_cached_bytes_per_row(1024, 512, 2, RowSource::kCopy, Logits::kInRegisters),
            2 * 512);
  const ChunkPlan fits =
      plan_chunks(1000, 1024, 512, 2, RowSource::kCopy, 1000 * per_row, Logits::kInRegisters);
  EXPECT_TRUE(fits.cache);
  EXPECT_EQ(fits.chunks, 1);
  // 1000 rows' budget: 1000 rows each for the fused kernels, down to whole tiles of 128 classes;
  // 1000 * 5120 / 9216 = 555 for logits in memory.
  const ChunkPlan fused =
      plan_chunks(5000, 1024, 512, 2, RowSource::kCopy, 1000 * per_row, Logits::kInRegisters);
  EXPECT_FALSE(fused.cache);
  EXPECT_EQ(fused.chunk_rows, 896);
  EXPECT_EQ(fused.chunks, 6);
  EXPECT_EQ(plan_chunks(5000, 1024, 512, 2, RowSource::kCopy, 1000 * per_row).chunk_rows, 555);
  // Below one tile, any row count.
  EXPECT_EQ(plan_chunks(5000, 1024, 512, 2, RowSource::kCopy, 100 * per_row, Logits::kInRegisters)
                .chunk_rows,
            100);
}

TEST(ChunkPlan, AlwaysAtLeastOneRowAndNoChunksForNoRows) {
  EXPECT_EQ(plan_chunks(10, 64, 64, 4, RowSource::kCopy, 1).chunk_rows, 1);
  EXPECT_EQ(plan_chunks(10, 64, 64, 4, RowSource::kCopy, 1).chunks, 10);
  EXPECT_EQ(plan_chunks(0, 64, 64, 4, RowSource::kCopy, 1 << 20).chunks, 0);
}

}  // namespace
}  // namespace myriad
