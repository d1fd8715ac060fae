#include "myriad/train/straggler_report.h"

#include <gtest/gtest.h>

#include <vector>

namespace myriad {
namespace {

TEST(FindStragglers, NamesRanksMoreThanTwentyPercentAboveTheMedian) {
  // Median 10.5 (odd count), so the line is 12.6: 12.5 is under it, 12.7 over.
  const Stragglers found = find_stragglers({10.0, 12.5, 9.0, 12.0, 10.5});
  EXPECT_DOUBLE_EQ(found.median_ms, 10.5);
  EXPECT_EQ(found.ranks, std::vector<int>({}));
  const Stragglers slow = find_stragglers({10.0, 12.7, 9.0, 12.0, 10.5});
  EXPECT_EQ(slow.ranks, std::vector<int>({1}));
}

TEST(FindStragglers, EvenCountsTakeTheMeanOfTheMiddleTwo) {
  // Median 25, so the line is 30: exactly 20% above (rank 3) is not a straggler.
  const Stragglers found = find_stragglers({40.0, 10.0, 20.0, 30.0});
  EXPECT_DOUBLE_EQ(found.median_ms, 25.0);
  EXPECT_EQ(found.ranks, std::vector<int>({0}));
}

TEST(FindStragglers, EqualRanksAndOneRankNameNobody) {
  EXPECT_TRUE(find_stragglers({7.0, 7.0, 7.0}).ranks.empty());
  EXPECT_TRUE(find_stragglers({7.0}).ranks.empty());
  EXPECT_TRUE(find_stragglers({}).ranks.empty());
}

}  // namespace
}  // namespace myriad
