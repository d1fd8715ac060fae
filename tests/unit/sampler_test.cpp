#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "myriad/data/distributed_sampler.h"
#include "myriad/util/error.h"

namespace myriad {
namespace {

TEST(DistributedSampler, RanksReadDisjointSlicesOfTheSameGlobalBatch) {
  const int64_t n = 1000, global = 96;
  for (int world : {1, 2, 3, 4}) {
    DistributedSampler sampler(n, global, world, 7);
    DistributedSampler single(n, global, 1, 7);
    EXPECT_EQ(sampler.steps_per_epoch(), n / global);
    for (int64_t epoch = 0; epoch < 2; ++epoch) {
      std::set<int64_t> epoch_seen;
      for (int64_t step = 0; step < sampler.steps_per_epoch(); ++step) {
        const DataPosition position{epoch, step * global};
        std::vector<int64_t> all;
        for (int r = 0; r < world; ++r) {
          const std::vector<int64_t> mine = sampler.indices(position, r);
          EXPECT_EQ(static_cast<int64_t>(mine.size()),
                    global / world + (r < global % world ? 1 : 0));
          all.insert(all.end(), mine.begin(), mine.end());
        }
        // The global batch is the same whatever the number of ranks.
        EXPECT_EQ(all, single.indices(position, 0));
        for (int64_t i : all)
          EXPECT_TRUE(epoch_seen.insert(i).second) << "sample " << i << " read twice";
      }
      // All but the N mod G tail of the permutation is read.
      EXPECT_EQ(static_cast<int64_t>(epoch_seen.size()), sampler.steps_per_epoch() * global);
    }
  }
}

TEST(DistributedSampler, EpochsReshuffleAndSeedsDiffer) {
  DistributedSampler a(500, 50, 2, 1), b(500, 50, 2, 2);
  EXPECT_NE(a.indices({0, 0}, 0), a.indices({1, 0}, 0));
  EXPECT_NE(a.indices({0, 0}, 0), b.indices({0, 0}, 0));
  EXPECT_EQ(a.indices({3, 100}, 1), DistributedSampler(500, 50, 2, 1).indices({3, 100}, 1));
  // Over many epochs every sample is read, including those of the dropped tails.
  std::set<int64_t> seen;
  DistributedSampler tail(103, 10, 1, 5);
  for (int64_t epoch = 0; epoch < 20; ++epoch) {
    for (int64_t step = 0; step < tail.steps_per_epoch(); ++step) {
      for (int64_t i : tail.indices({epoch, step * 10}, 0)) seen.insert(i);
    }
  }
  EXPECT_EQ(seen.size(), 103u);
}

TEST(DistributedSampler, RejectsDatasetsSmallerThanOneBatch) {
  EXPECT_THROW(DistributedSampler(10, 32, 2, 0), Error);
  EXPECT_THROW(DistributedSampler(10, 1, 2, 0), Error);
  DistributedSampler s(100, 10, 2, 0);
  EXPECT_THROW(s.indices({0, 95}, 0), Error);
  EXPECT_THROW(s.indices({0, 0}, 2), Error);
}

// Positions advance batch by batch, wrap into the next epoch when less than a global batch is
// left, and mean the same samples whatever the global batch was before: a run resumed on a
// different number of ranks continues in the same permutation.
TEST(DistributedSampler, PositionsAdvanceAcrossEpochsAndGlobalBatches) {
  DistributedSampler s(103, 10, 2, 4);
  DataPosition p{0, 0};
  for (int k = 0; k < 10; ++k) p = s.advance(p, 1);
  EXPECT_EQ(p.epoch, 1);
  EXPECT_EQ(p.offset, 0);
  EXPECT_EQ(s.advance({0, 0}, 25).epoch, 2);
  EXPECT_EQ(s.advance({0, 0}, 25).offset, 50);
  EXPECT_EQ(s.advance({0, 90}, 1).epoch, 1);
  DistributedSampler wider(103, 30, 3, 4);
  std::vector<int64_t> three;
  for (int r = 0; r < 3; ++r) {
    const auto part = wider.indices({2, 40}, r);
    three.insert(three.end(), part.begin(), part.end());
  }
  std::vector<int64_t> one;
  for (int64_t offset : {40, 50, 60}) {
    const auto part = s.indices({2, offset}, 0), part2 = s.indices({2, offset}, 1);
    one.insert(one.end(), part.begin(), part.end());
    one.insert(one.end(), part2.begin(), part2.end());
  }
  EXPECT_EQ(three, one);
}

}  // namespace
}  // namespace myriad
