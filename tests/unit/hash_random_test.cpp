#include <gtest/gtest.h>
#include <torch/torch.h>

#include "myriad/classifier/partial_fc.h"
#include "myriad/util/hash_random.h"

namespace myriad {
namespace {

TEST(HashRandom, SameKeysSameNumbersWhateverTheChunking) {
  const torch::Tensor keys = torch::arange(1000, 5000, torch::kInt64);
  const torch::Tensor whole = hash_normal(keys, 42);
  const torch::Tensor part = hash_normal(keys.slice(0, 1500, 2500), 42);
  EXPECT_TRUE(torch::equal(whole.slice(0, 1500, 2500), part));
  EXPECT_FALSE(torch::equal(whole, hash_normal(keys, 43)));
}

TEST(HashRandom, DistributionsHaveTheRightMoments) {
  const torch::Tensor keys = torch::arange(0, 400000, torch::kInt64);
  const torch::Tensor u = hash_uniform(keys, 7);
  EXPECT_GE(u.min().item<float>(), 0.0f);
  EXPECT_LT(u.max().item<float>(), 1.0f);
  EXPECT_NEAR(u.mean().item<double>(), 0.5, 0.005);
  const torch::Tensor n = hash_normal(keys, 7);
  EXPECT_NEAR(n.mean().item<double>(), 0.0, 0.01);
  EXPECT_NEAR(n.std().item<double>(), 1.0, 0.01);
  EXPECT_TRUE(n.isfinite().all().item<bool>());
}

// Partial FC: the classes a shard keeps are exactly the single-shard choice restricted to it.
TEST(PartialFc, SamplingDoesNotDependOnTheSharding) {
  const int64_t classes = 1000;
  const torch::Tensor labels = torch::tensor({3, 999, 500, 501, 3}, torch::kInt64);
  const torch::Tensor whole = sample_class_rows(labels, classes, 0, 0.2, 9, 4);
  std::vector<torch::Tensor> pieces;
  for (int64_t offset : {0, 333, 666}) {
    const int64_t rows = offset == 666 ? 334 : 333;
    const torch::Tensor local = labels - offset;
    const torch::Tensor mine =
        torch::where(local.ge(0).logical_and(local.lt(rows)), local, torch::full_like(local, -1));
    pieces.push_back(sample_class_rows(mine, rows, offset, 0.2, 9, 4) + offset);
  }
  EXPECT_TRUE(torch::equal(torch::cat(pieces), whole));
  for (int64_t label : {3, 999, 500, 501}) EXPECT_TRUE(whole.eq(label).any().item<bool>()) << label;
  EXPECT_NEAR(whole.size(0), 200, 45);
  EXPECT_FALSE(torch::equal(whole, sample_class_rows(labels, classes, 0, 0.2, 9, 5)));
}

}  // namespace
}  // namespace myriad
