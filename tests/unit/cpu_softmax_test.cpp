// The CPU softmax's kept exponentials: the gradient backward forms from them against the one it
// forms from the logits, over chunks of several tiles of rows, for a normalising margin and for
// plain softmax, in float32 and bfloat16.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "classifier/cpu_softmax.h"
#include "myriad/util/error.h"

namespace myriad {
namespace {

// Each sample's max and 1/sum over the chunk from its tiles, in float64.
void merged_statistics(const torch::Tensor& tile_max, const torch::Tensor& tile_sum,
                       torch::Tensor& row_max, torch::Tensor& row_inv_sum) {
  const torch::Tensor m = tile_max.to(torch::kFloat64), s = tile_sum.to(torch::kFloat64);
  const torch::Tensor top = std::get<0>(m.max(0));
  row_max = top.to(torch::kFloat32).contiguous();
  row_inv_sum = (s * (m - top).exp()).sum(0).reciprocal().to(torch::kFloat32).contiguous();
}

struct Case {
  std::string name;
  MarginParams params;
  bool scaled;  // cosines are dot * row_scale
};

TEST(CpuSoftmax, KeptExponentialsGiveTheGradientOfTheLogits) {
  MarginParams arcface;
  arcface.m2 = 0.5f;
  MarginParams softmax;
  softmax.normalized = false;
  // 10007 rows of 19 samples: three tiles of rows, the last partial.
  const int64_t rows = 10007, batch = 19, begin = 40;
  for (const Case& c : {Case{"arcface", arcface, true}, Case{"softmax", softmax, false}}) {
    torch::manual_seed(11);
    CpuChunkLogits chunk;
    chunk.dot = c.scaled ? torch::rand({rows, batch}) * 1.2 - 1 : torch::randn({rows, batch}) * 4;
    if (c.scaled) chunk.row_scale = torch::rand({rows}) * 0.5 + 0.75;
    // Targets in each tile, and some in another chunk (before it, after it).
    chunk.target_col = torch::randint(0, rows + 2 * begin, {batch}, torch::kInt64);
    chunk.begin = begin;
    chunk.params = c.params;
    // Every other sample's target dominates its logits (softmax near 1: the one-hot's
    // cancellation); the others' lie among theirs.
    for (int64_t b = 0; b < batch; b += 2) {
      const int64_t j = chunk.target_col[b].item<int64_t>() - begin;
      if (j < 0 || j >= rows) continue;
      chunk.dot[j][b] = c.scaled ? 0.99 / chunk.row_scale[j].item<double>() : 40.0;
    }
    torch::Tensor tile_max, tile_sum, target_logit = torch::zeros({batch});
    cpu_chunk_stats(chunk, tile_max, tile_sum, target_logit);
    CpuKeptExponentials kept;
    kept.exps = torch::empty_like(chunk.dot);
    torch::Tensor kept_max, kept_sum, kept_target = torch::zeros({batch});
    cpu_chunk_stats(chunk, kept_max, kept_sum, kept_target, &kept);
    ASSERT_GE(tile_max.size(0), 3) << c.name;
    EXPECT_TRUE(torch::equal(tile_max, kept_max) && torch::equal(tile_sum, kept_sum) &&
                torch::equal(target_logit, kept_target))
        << c.name << ": keeping the exponentials changed the statistics";
    torch::Tensor row_max, row_inv_sum;
    merged_statistics(tile_max, tile_sum, row_max, row_inv_sum);
    const torch::Tensor in_chunk = (chunk.target_col >= begin) & (chunk.target_col < begin + rows);
    ASSERT_GE(in_chunk.sum().item<int64_t>(), 4) << c.name;
    for (const torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
      const std::string label = c.name + ", " + c10::toString(dtype);
      const torch::Tensor expected =
          cpu_chunk_grad(chunk, row_max, row_inv_sum, 0.25f, dtype).to(torch::kFloat64);
      CpuKeptExponentials again = kept;
      again.exps = kept.exps.clone();
      const torch::Tensor got = cpu_kept_grad(again, c.params, row_max, row_inv_sum, 0.25f, dtype);
      ASSERT_EQ(got.scalar_type(), dtype) << label;
      const torch::Tensor g = got.to(torch::kFloat64);
      // They differ by the roundings of exp(z - tile max) exp(tile max - max) against
      // exp(z - max), whose arguments of up to 2 s = 128 are rounded to 8e-6: a few float32 ulps
      // of the result and that, or one bfloat16 rounding.
      const double tolerance = dtype == torch::kFloat32 ? 3e-5 : 1.0 / 128;
      const torch::Tensor off = (g - expected).abs() - tolerance * expected.abs();
      EXPECT_LE(off.max().item<double>(), 1e-30) << label;
      EXPECT_GT(expected.abs().max().item<double>(), 0.0) << label;
    }
  }
}

TEST(CpuSoftmax, KeptExponentialsOfAnotherShapeAreRefused) {
  CpuChunkLogits chunk{torch::zeros({8, 4}), torch::Tensor(), torch::zeros({4}, torch::kInt64), 0,
                       MarginParams{}};
  torch::Tensor tile_max, tile_sum, target_logit = torch::zeros({4});
  CpuKeptExponentials kept;
  kept.exps = torch::empty({8, 3});
  EXPECT_THROW(cpu_chunk_stats(chunk, tile_max, tile_sum, target_logit, &kept), Error);
  kept.exps = torch::empty({8, 4}, torch::kBFloat16);
  EXPECT_THROW(cpu_chunk_stats(chunk, tile_max, tile_sum, target_logit, &kept), Error);
}

}  // namespace
}  // namespace myriad
