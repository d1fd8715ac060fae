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
        std::vector<int64_t> all;
        for (int r = 0; r < world; ++r) {
          const std::vector<int64_t> mine = sampler.indices(epoch, step, r);
          EXPECT_EQ(static_cast<int64_t>(mine.size()), global / world + (r < global % world ? 1 : 0));
          all.insert(all.end(), mine.begin(), mine.end());
        }
        // The global batch is the same whatever the number of ranks.
        EXPECT_EQ(all, single.indices(epoch, step, 0));
        for (int64_t i : all) EXPECT_TRUE(epoch_seen.insert(i).second) << "sample " << i << " read twice";
      }
      // All but the N mod G tail of the permutation is read.
      EXPECT_EQ(static_cast<int64_t>(epoch_seen.size()), sampler.steps_per_epoch() * global);
    }
  }
}

TEST(DistributedSampler, EpochsReshuffleAndSeedsDiffer) {
  DistributedSampler a(500, 50, 2, 1), b(500, 50, 2, 2);
  EXPECT_NE(a.indices(0, 0, 0), a.indices(1, 0, 0));
  EXPECT_NE(a.indices(0, 0, 0), b.indices(0, 0, 0));
  EXPECT_EQ(a.indices(3, 2, 1), DistributedSampler(500, 50, 2, 1).indices(3, 2, 1));
  // Over many epochs every sample is read, including those of the dropped tails.
  std::set<int64_t> seen;
  DistributedSampler tail(103, 10, 1, 5);
  for (int64_t epoch = 0; epoch < 20; ++epoch) {
    for (int64_t step = 0; step < tail.steps_per_epoch(); ++step) {
      for (int64_t i : tail.indices(epoch, step, 0)) seen.insert(i);
    }
  }
  EXPECT_EQ(seen.size(), 103u);
}

TEST(DistributedSampler, RejectsDatasetsSmallerThanOneBatch) {
  EXPECT_THROW(DistributedSampler(10, 32, 2, 0), Error);
  EXPECT_THROW(DistributedSampler(10, 1, 2, 0), Error);
  DistributedSampler s(100, 10, 2, 0);
  EXPECT_THROW(s.indices(0, 10, 0), Error);
  EXPECT_THROW(s.indices(0, 0, 2), Error);
}

}  // namespace
}  // namespace myriad
