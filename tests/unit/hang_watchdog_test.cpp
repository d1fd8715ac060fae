// The hang watchdog's clocks where they must stay quiet (a firing watchdog ends this process, so
// each of these fails by the process dying), and the start-up log's placement line.

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "myriad/comm/hang_watchdog.h"
#include "myriad/comm/process_context.h"

namespace myriad {
namespace {

constexpr double kTimeout = 0.4;

void sleep_for(double seconds) {
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

class HangWatchdogTest : public ::testing::Test {
 protected:
  void SetUp() override { HangWatchdog::instance().start(kTimeout); }
  void TearDown() override { HangWatchdog::instance().stop(); }
};

TEST_F(HangWatchdogTest, RunsAndStops) {
  EXPECT_TRUE(HangWatchdog::instance().running());
  EXPECT_EQ(HangWatchdog::instance().timeout_seconds(), kTimeout);
}

// cuDNN's search, lazy initialisation: the first step after a start is not timed.
TEST_F(HangWatchdogTest, FirstStepIsNotTimed) {
  HangWatchdog::instance().step_started(0);
  sleep_for(3 * kTimeout);
  HangWatchdog::instance().step_started(1);
  sleep_for(kTimeout / 4);
}

TEST_F(HangWatchdogTest, StepsShorterThanTheTimeoutPass) {
  for (int64_t step = 0; step < 8; ++step) {
    HangWatchdog::instance().step_started(step);
    sleep_for(kTimeout / 4);
  }
}

// A checkpoint being written, an evaluation: no step starts for longer than the timeout.
TEST_F(HangWatchdogTest, LocalWorkStopsTheStepClock) {
  HangWatchdog::instance().step_started(0);
  HangWatchdog::instance().step_started(1);
  {
    const LocalWork work("a checkpoint");
    sleep_for(3 * kTimeout);
  }
  // The work's time does not count against the next step either.
  sleep_for(kTimeout / 2);
  HangWatchdog::instance().step_started(2);
}

TEST_F(HangWatchdogTest, ShortWaitsPass) {
  for (int i = 0; i < 8; ++i) {
    const WaitScope outer("all_reduce", "mpi", 4);
    const WaitScope inner("agreement", "mpi", 4);
    sleep_for(kTimeout / 4);
  }
}

TEST(HangWatchdog, OffWithZeroTimeout) {
  HangWatchdog::instance().start(0);
  EXPECT_FALSE(HangWatchdog::instance().running());
  const WaitScope wait("all_reduce", "mpi", 2);
  sleep_for(0.1);
}

TEST(Placement, GroupsRanksByHostWithRanges) {
  EXPECT_EQ(describe_placement({"myrh1", "myrh1", "myrh2", "myrh2"}, {"cpu", "cpu", "cpu", "cpu"}),
            "4 ranks on 2 hosts: myrh1 ranks 0-1 on cpu, myrh2 ranks 2-3 on cpu");
  EXPECT_EQ(describe_placement({"a", "a", "b", "c"}, {"cuda:0", "cuda:1", "cuda:0", "cuda:0"}),
            "4 ranks on 3 hosts: a ranks 0-1 on cuda:0-1, b rank 2 on cuda:0, c rank 3 on cuda:0");
  EXPECT_EQ(describe_placement({"n"}, {"cuda:3"}), "1 rank on 1 host: n rank 0 on cuda:3");
  // Ranks placed round robin, and GPUs out of order.
  EXPECT_EQ(describe_placement({"a", "b", "a", "b", "a"},
                               {"cuda:2", "cuda:0", "cuda:0", "cuda:1", "cuda:1"}),
            "5 ranks on 2 hosts: a ranks 0,2,4 on cuda:0-2, b ranks 1,3 on cuda:0-1");
  EXPECT_EQ(describe_placement({"a", "a"}, {"cpu", "cuda:0"}),
            "2 ranks on 1 host: a ranks 0-1 on cpu,cuda:0");
}

}  // namespace
}  // namespace myriad
