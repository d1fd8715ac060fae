#include <gtest/gtest.h>
#include <torch/torch.h>

#include "myriad/train/evaluation.h"
#include "myriad/util/error.h"

namespace myriad {
namespace {

TEST(Verification, SeparablePairsScorePerfectly) {
  std::vector<bool> issame;
  std::vector<float> similarity;
  for (int i = 0; i < 600; ++i) {
    issame.push_back(i % 2 == 0);
    similarity.push_back(i % 2 == 0 ? 0.6f + 0.001f * (i % 50) : 0.1f - 0.001f * (i % 50));
  }
  const VerificationEval v = ten_fold_accuracy(torch::tensor(similarity), issame);
  EXPECT_EQ(v.pairs, 600);
  EXPECT_DOUBLE_EQ(v.accuracy, 1.0);
  EXPECT_NEAR(v.std, 0.0, 1e-12);
  EXPECT_GT(v.threshold, 0.05);
  EXPECT_LT(v.threshold, 0.6);
}

TEST(Verification, OverlapGivesTheExpectedErrorRate) {
  // Same-identity similarities uniform in [0.2, 1], different ones in [0, 0.8]: the best
  // threshold (0.5) misclassifies 3/8 of each.
  torch::manual_seed(3);
  const int64_t n = 6000;
  std::vector<bool> issame(n);
  torch::Tensor similarity = torch::empty({n});
  const torch::Tensor u = torch::rand({n});
  for (int64_t i = 0; i < n; ++i) {
    issame[i] = i % 2 == 0;
    similarity[i] = issame[i] ? 0.2 + 0.8 * u[i].item<float>() : 0.8 * u[i].item<float>();
  }
  const VerificationEval v = ten_fold_accuracy(similarity, issame);
  EXPECT_NEAR(v.accuracy, 0.625, 0.02);
  EXPECT_NEAR(v.threshold, 0.5, 0.06);
}

TEST(Verification, TooFewPairsIsAnError) {
  EXPECT_THROW(ten_fold_accuracy(torch::zeros({5}), std::vector<bool>(5, true)), Error);
  EXPECT_THROW(ten_fold_accuracy(torch::zeros({20}), std::vector<bool>(19, true)), Error);
}

}  // namespace
}  // namespace myriad
