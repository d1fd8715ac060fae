#include <gtest/gtest.h>

#include "myriad/classifier/class_partition.h"
#include "myriad/util/balanced_split.h"
#include "myriad/util/error.h"

namespace myriad {
namespace {

TEST(ClassPartition, BalancedSplitWithRemainderFirst) {
  EXPECT_EQ(balanced_counts(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(balanced_counts(8, 4), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(balanced_counts(0, 3), (std::vector<int64_t>{0, 0, 0}));
}

TEST(ClassPartition, OffsetsOwnersAndLocalIndices) {
  for (int world : {1, 2, 3, 4, 7}) {
    for (int64_t classes : {int64_t{7}, int64_t{10}, int64_t{37}, int64_t{1000003}}) {
      if (classes < world) continue;
      const ClassPartition part(classes, world);
      int64_t offset = 0;
      for (int r = 0; r < world; ++r) {
        EXPECT_EQ(part.offset(r), offset);
        EXPECT_EQ(part.size(r), classes / world + (r < classes % world ? 1 : 0));
        // First, last and a middle class of each shard map back to it.
        for (int64_t label : {offset, offset + part.size(r) / 2, offset + part.size(r) - 1}) {
          EXPECT_EQ(part.owner(label), r)
              << classes << " classes, " << world << " ranks, label " << label;
          EXPECT_EQ(part.local_index(label), label - offset);
        }
        offset += part.size(r);
      }
      EXPECT_EQ(offset, classes);
    }
  }
}

TEST(ClassPartition, RejectsTooFewClassesAndBadLabels) {
  EXPECT_THROW(ClassPartition(3, 4), Error);
  EXPECT_THROW(ClassPartition(0, 1), Error);
  EXPECT_THROW(ClassPartition(-5, 1), Error);
  const ClassPartition part(10, 3);
  EXPECT_THROW(part.owner(10), Error);
  EXPECT_THROW(part.owner(-1), Error);
}

}  // namespace
}  // namespace myriad
