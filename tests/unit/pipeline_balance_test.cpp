// The pipeline balancer against brute force: on random synthetic cost models, its cut is the best
// of all contiguous cuts under the same model (the slowest stage, then the sum of squares), with
// and without a memory limit; and hand cuts are checked.

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>

#include "myriad/parallel/pipeline_balance.h"
#include "myriad/util/error.h"

namespace myriad {
namespace {

// Every cut of n blocks into p non-empty stages, by recursion over the stage starts.
void every_cut(int64_t n, int p, std::vector<int64_t>& cut,
               const std::function<void(const std::vector<int64_t>&)>& visit) {
  if (static_cast<int>(cut.size()) == p) {
    cut.push_back(n);
    visit(cut);
    cut.pop_back();
    return;
  }
  const int64_t remaining = p - static_cast<int64_t>(cut.size());
  for (int64_t start = cut.back() + 1; start <= n - remaining; ++start) {
    cut.push_back(start);
    every_cut(n, p, cut, visit);
    cut.pop_back();
  }
}

TEST(PipelineBalance, EqualsTheBestOfAllContiguousCuts) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> time(0.1, 5.0), bytes(1.0, 100.0);
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t n = 3 + trial % 9;
    const int p = 1 + trial % std::min<int64_t>(4, n);
    std::vector<BlockCost> costs(static_cast<size_t>(n));
    // Blocks bound by the device and blocks bound by their launches, mixed in a stage.
    for (BlockCost& c : costs) c = {time(gen), time(gen), bytes(gen), bytes(gen)};
    std::vector<int64_t> in_flight(static_cast<size_t>(p));
    for (int s = 0; s < p; ++s) in_flight[s] = 1 + (trial + s) % 4;
    // Half the trials under a memory limit that rules some cuts out.
    const double limit = trial % 2 == 0 ? std::numeric_limits<double>::infinity() : 400.0;

    double best_slowest = std::numeric_limits<double>::infinity(), best_squares = 0;
    std::vector<int64_t> start = {0};
    every_cut(n, p, start, [&](const std::vector<int64_t>& cut) {
      const StageCut c = evaluate_cut(costs, cut, in_flight);
      if (*std::max_element(c.stage_bytes.begin(), c.stage_bytes.end()) > limit) return;
      const double slowest = *std::max_element(c.stage_seconds.begin(), c.stage_seconds.end());
      double squares = 0;
      for (double t : c.stage_seconds) squares += t * t;
      if (slowest < best_slowest || (slowest == best_slowest && squares < best_squares)) {
        best_slowest = slowest;
        best_squares = squares;
      }
    });
    const std::optional<StageCut> got = balance_stages(costs, in_flight, limit);
    if (best_slowest == std::numeric_limits<double>::infinity()) {
      EXPECT_FALSE(got.has_value()) << "trial " << trial;
      continue;
    }
    ASSERT_TRUE(got.has_value()) << "trial " << trial;
    ASSERT_EQ(got->cut.size(), static_cast<size_t>(p + 1));
    EXPECT_EQ(got->cut.front(), 0);
    EXPECT_EQ(got->cut.back(), n);
    const double slowest = *std::max_element(got->stage_seconds.begin(), got->stage_seconds.end());
    EXPECT_NEAR(slowest, best_slowest, 1e-12) << "trial " << trial;
    for (double b : got->stage_bytes) EXPECT_LE(b, limit);
  }
}

TEST(PipelineBalance, AUniformModelIsCutEvenly) {
  const std::vector<BlockCost> costs(12, BlockCost{1.0, 0.5, 0.0, 0.0});
  const std::optional<StageCut> cut =
      balance_stages(costs, {4, 4, 4}, std::numeric_limits<double>::infinity());
  ASSERT_TRUE(cut.has_value());
  EXPECT_EQ(cut->cut, (std::vector<int64_t>{0, 4, 8, 12}));
}

TEST(PipelineBalance, HandSplitsMustGiveEveryStageABlock) {
  EXPECT_EQ(parse_pipeline_split("3,7", 3, 10), (std::vector<int64_t>{0, 3, 7, 10}));
  EXPECT_THROW(parse_pipeline_split("3", 3, 10), UsageError);     // two stages given
  EXPECT_THROW(parse_pipeline_split("7,3", 3, 10), UsageError);   // not increasing
  EXPECT_THROW(parse_pipeline_split("0,5", 3, 10), UsageError);   // stage 0 has no block
  EXPECT_THROW(parse_pipeline_split("5,10", 3, 10), UsageError);  // the last has none
  EXPECT_THROW(parse_pipeline_split("5,x", 3, 10), UsageError);
}

// An eager stage goes at the slower of its device and its host: the sum of its blocks' device
// times, or of their launch times, whichever is larger; never the sum of the larger of each.
TEST(PipelineBalance, AnEagerStageGoesAtTheSlowerOfDeviceAndHost) {
  std::vector<BlockCost> costs(3);
  const double device[] = {4.0, 1.0, 1.0}, launch[] = {1.0, 2.0, 2.0};
  for (size_t b = 0; b < costs.size(); ++b) costs[b] = {device[b], launch[b], 0.0, 0.0};
  EXPECT_DOUBLE_EQ(stage_seconds(costs, 0, 3), 6.0);  // the device's 6 against the host's 5
  EXPECT_DOUBLE_EQ(stage_seconds(costs, 1, 3), 4.0);  // the host's 4 against the device's 2
  EXPECT_DOUBLE_EQ(stage_seconds(costs, 0, 1), 4.0);
  const StageCut cut = evaluate_cut(costs, {0, 1, 3}, {1, 1});
  EXPECT_EQ(cut.stage_seconds, (std::vector<double>{4.0, 4.0}));
}

// Stages that replay CUDA graphs are balanced on the blocks' device times alone: a block whose
// kernels are many but short (launch-heavy) weighs less there than its eager time says.
TEST(PipelineBalance, ReplayedCostsBalanceTheDeviceTimes) {
  std::vector<BlockCost> costs(4);
  const double device[] = {1.0, 0.5, 0.5, 1.0}, launch[] = {1.0, 2.0, 2.0, 1.0};
  for (size_t b = 0; b < costs.size(); ++b) costs[b] = {device[b], launch[b], 0.0, 0.0};
  const double unlimited = std::numeric_limits<double>::infinity();
  const std::optional<StageCut> by_eager = balance_stages(costs, {1, 1, 1}, unlimited);
  const std::optional<StageCut> by_replay =
      balance_stages(replayed_costs(costs), {1, 1, 1}, unlimited);
  ASSERT_TRUE(by_eager && by_replay);
  EXPECT_EQ(by_eager->cut, (std::vector<int64_t>{0, 1, 2, 4}));
  EXPECT_EQ(by_eager->stage_seconds, (std::vector<double>{1.0, 2.0, 3.0}));
  EXPECT_EQ(by_replay->cut, (std::vector<int64_t>{0, 1, 3, 4}));
  EXPECT_EQ(by_replay->stage_seconds, (std::vector<double>{1.0, 1.0, 1.0}));
}

TEST(PipelineBalance, ChainedLaunchesOnlyShortenTheLaunchTimes) {
  std::vector<BlockCost> costs(3);
  const std::vector<double> launches = {1.0, 2.0, 5.0};
  for (size_t b = 0; b < costs.size(); ++b) {
    costs[b].launch_seconds = launches[b];
    costs[b].device_seconds = 10.0 + b;
  }
  // A chain of 4 s against 8 s launched alone: every block's launch halves, its device time stays.
  const std::vector<BlockCost> chained = chained_launches(costs, 4.0);
  for (size_t b = 0; b < costs.size(); ++b) {
    EXPECT_DOUBLE_EQ(chained[b].launch_seconds, launches[b] / 2.0);
    EXPECT_EQ(chained[b].device_seconds, costs[b].device_seconds);
  }
  // A chain slower than the blocks alone, or none timed, changes nothing.
  for (const double chain : {8.0, 12.0, 0.0}) {
    const std::vector<BlockCost> same = chained_launches(costs, chain);
    for (size_t b = 0; b < costs.size(); ++b)
      EXPECT_EQ(same[b].launch_seconds, launches[b]) << "chain " << chain;
  }
}

}  // namespace
}  // namespace myriad
