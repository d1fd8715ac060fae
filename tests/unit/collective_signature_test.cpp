#include <gtest/gtest.h>
#include <torch/torch.h>

#include "comm/collective_signature.h"

namespace myriad {
namespace {

TEST(CollectiveSignature, AgreeingCallsPass) {
  const torch::Tensor t = torch::ones({4, 3});
  const auto sig = describe_call("all_reduce", t, ShapeRule::kSameShape, 0, -1, nullptr);
  EXPECT_EQ(find_disagreement("all_reduce", {sig, sig, sig}, torch::kCPU), "");
}

TEST(CollectiveSignature, RowRuleIgnoresDimZeroButNotRows) {
  std::vector<int64_t> counts{4, 2};
  const auto a =
      describe_call("all_gather", torch::ones({4, 3}), ShapeRule::kSameRowShape, -1, -1, &counts);
  const auto b =
      describe_call("all_gather", torch::ones({2, 3}), ShapeRule::kSameRowShape, -1, -1, &counts);
  EXPECT_EQ(find_disagreement("all_gather", {a, b}, torch::kCPU), "");
  const auto c =
      describe_call("all_gather", torch::ones({2, 5}), ShapeRule::kSameRowShape, -1, -1, &counts);
  EXPECT_NE(find_disagreement("all_gather", {a, c}, torch::kCPU).find("shapes differ"),
            std::string::npos);
}

TEST(CollectiveSignature, NamesTheOffendingRank) {
  const auto good =
      describe_call("broadcast", torch::ones({3}), ShapeRule::kSameShape, -1, 0, nullptr);
  auto bad = describe_call("broadcast", torch::ones({3}, torch::kFloat64), ShapeRule::kSameShape,
                           -1, 0, nullptr);
  const std::string message = find_disagreement("broadcast", {good, good, bad}, torch::kCPU);
  EXPECT_NE(message.find("rank 2"), std::string::npos) << message;
  EXPECT_NE(message.find("Double"), std::string::npos) << message;
  bad.problem = static_cast<int64_t>(CallProblem::kNotContiguous);
  EXPECT_NE(find_disagreement("broadcast", {good, bad}, torch::kCPU).find("rank 1"),
            std::string::npos);
}

TEST(CollectiveSignature, DifferentCollectivesDisagree) {
  const torch::Tensor t = torch::ones({3});
  const auto a = describe_call("all_reduce", t, ShapeRule::kSameShape, 0, -1, nullptr);
  const auto b = describe_call("broadcast", t, ShapeRule::kSameShape, -1, 0, nullptr);
  EXPECT_NE(find_disagreement("all_reduce", {a, b}, torch::kCPU).find("different collective"),
            std::string::npos);
}

}  // namespace
}  // namespace myriad
