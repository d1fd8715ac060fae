#include "myriad/util/phase_timer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>

namespace myriad {
namespace {

void sleep_ms(int ms) {
  std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

TEST(PhaseTimer, MarksWhilePausedLeaveTheRunningPhaseTimed) {
  PhaseTimer timer(torch::kCPU, /*enabled=*/true);
  timer.mark("forward");
  sleep_ms(20);
  {
    // The pipeline's classifier parts, queued beside the stage's work, mark phases of their own.
    const PhaseTimer::Paused untimed(&timer);
    timer.mark("classifier");
    sleep_ms(20);
    timer.mark("backward");
  }
  sleep_ms(20);
  timer.mark("exchange");
  sleep_ms(5);
  timer.stop();
  const std::map<std::string, double> totals = timer.totals();
  ASSERT_EQ(totals.size(), 2u);
  EXPECT_EQ(totals.count("classifier") + totals.count("backward"), 0u);
  // The host clock on the CPU: the running phase spans all three sleeps.
  EXPECT_GE(totals.at("forward"), 60.0);
  EXPECT_GE(totals.at("exchange"), 5.0);
}

TEST(PhaseTimer, APauseEndsWithItsScopeOnFailureToo) {
  PhaseTimer timer(torch::kCPU, /*enabled=*/true);
  timer.mark("forward");
  try {
    const PhaseTimer::Paused untimed(&timer);
    timer.mark("classifier");
    throw std::runtime_error("a part failed");
  } catch (const std::runtime_error&) {
  }
  timer.mark("exchange");
  timer.stop();
  const std::map<std::string, double> totals = timer.totals();
  EXPECT_EQ(totals.count("classifier"), 0u);
  EXPECT_EQ(totals.count("exchange"), 1u);
}

TEST(PhaseTimer, ADisabledTimerTimesNothing) {
  PhaseTimer timer(torch::kCPU, /*enabled=*/false);
  timer.mark("forward");
  timer.stop();
  EXPECT_TRUE(timer.totals().empty());
}

}  // namespace
}  // namespace myriad
