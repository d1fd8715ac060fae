// The ranks of a host agree which GPU each drives before anything opens NCCL: told (by the test's
// override) that their host has fewer GPUs than ranks, every rank refuses with the same one line.

#include <cstdlib>
#include <string>

#include "mpi_test.h"
#include "myriad/util/error.h"

namespace myriad::testing {
namespace {

// Sets $MYRIAD_FAULT_HOST_GPUS for the scope of one test.
class HostGpus {
 public:
  explicit HostGpus(int gpus) { setenv("MYRIAD_FAULT_HOST_GPUS", std::to_string(gpus).c_str(), 1); }
  ~HostGpus() { unsetenv("MYRIAD_FAULT_HOST_GPUS"); }
};

using DevicePlanTest = MpiTest;

TEST_F(DevicePlanTest, RanksOfOneHostAgreeOnTheirGpus) {
  const HostGpus gpus(world());
  const GpuPlan plan = context().plan_gpus();
  ASSERT_EQ(static_cast<int>(plan.index.size()), world());
  // Every rank of this one host takes the GPU of its local rank, and none shares.
  for (int r = 0; r < world(); ++r) EXPECT_EQ(plan.index[r], r);
  EXPECT_TRUE(plan.conflicts.empty()) << plan.conflicts.front();
}

TEST_F(DevicePlanTest, MoreRanksThanGpusAreRefusedOnEveryRank) {
  if (world() < 2) GTEST_SKIP() << "needs two ranks on the host";
  const HostGpus gpus(1);
  const GpuPlan plan = context().plan_gpus();
  ASSERT_EQ(plan.conflicts.size(), 1u);
  for (const DevicePreference preference : {DevicePreference::kAuto, DevicePreference::kCuda}) {
    std::string message;
    try {
      context().select_device(preference);
      ADD_FAILURE() << "ranks sharing a GPU were not refused (--device " << to_string(preference)
                    << ")";
    } catch (const UsageError& e) {
      message = e.message();
    }
    EXPECT_EQ(message, plan.conflicts.front());
    EXPECT_NE(message.find(str_format("runs {} ranks", world())), std::string::npos) << message;
    EXPECT_NE(message.find("see 1 GPU"), std::string::npos) << message;
  }
  // The CPU needs no GPU of its own.
  EXPECT_TRUE(context().select_device(DevicePreference::kCpu).is_cpu());
}

}  // namespace
}  // namespace myriad::testing
