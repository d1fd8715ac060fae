#include <gtest/gtest.h>

#include "myriad/comm/device_selection.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"

namespace myriad {
namespace {

// `ranks` ranks on `host`, local ranks 0..ranks-1, each seeing `gpus` (the same list).
std::vector<RankGpus> host_of(const std::string& host, int ranks,
                              const std::vector<std::string>& gpus,
                              const std::string& visible = "") {
  std::vector<RankGpus> table;
  for (int r = 0; r < ranks; ++r) table.push_back({host, r, gpus, visible});
  return table;
}

std::vector<RankGpus> operator+(std::vector<RankGpus> a, const std::vector<RankGpus>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

bool mentions(const std::string& line, const std::string& part) {
  return line.find(part) != std::string::npos;
}

TEST(DeviceSelection, MapsLocalRanksToTheirGpus) {
  const GpuPlan plan = plan_gpus(host_of("a", 4, {"g0", "g1", "g2", "g3"}) +
                                 host_of("b", 2, {"h0", "h1", "h2", "h3"}));
  EXPECT_EQ(plan.index, (std::vector<int>{0, 1, 2, 3, 0, 1}));
  EXPECT_TRUE(plan.conflicts.empty());
  EXPECT_TRUE(plan.every_rank_has_gpu());
}

TEST(DeviceSelection, OneVisibleGpuPerRankIsItsOwn) {
  // srun --gpus-per-task=1 or CUDA_VISIBLE_DEVICES per task: each rank sees its own GPU as 0.
  std::vector<RankGpus> table;
  for (int r = 0; r < 4; ++r)
    table.push_back({"a", r, {"g" + std::to_string(r)}, std::to_string(r)});
  const GpuPlan plan = plan_gpus(table);
  EXPECT_EQ(plan.index, (std::vector<int>{0, 0, 0, 0}));
  EXPECT_TRUE(plan.conflicts.empty());
}

TEST(DeviceSelection, TwoRanksOnOneGpuConflict) {
  const GpuPlan plan = plan_gpus(host_of("ws1", 2, {"GPU-1234"}));
  ASSERT_EQ(plan.conflicts.size(), 1u);
  const std::string& line = plan.conflicts[0];
  for (const char* part :
       {"ws1 runs 2 ranks (0-1)", "see 1 GPU", "ranks 0-1 on GPU-1234", "NCCL refuses",
        "at most 1 rank on this host", "slots=1", "--device cpu", "CUDA_VISIBLE_DEVICES unset"})
    EXPECT_TRUE(mentions(line, part)) << part << " not in: " << line;
}

TEST(DeviceSelection, FourRanksOnTwoGpusConflict) {
  const GpuPlan plan = plan_gpus(host_of("n1", 4, {"g0", "g1"}));
  EXPECT_EQ(plan.index, (std::vector<int>{0, 1, 0, 1}));
  ASSERT_EQ(plan.conflicts.size(), 1u);
  EXPECT_TRUE(mentions(plan.conflicts[0], "ranks 0,2 on g0, ranks 1,3 on g1")) << plan.conflicts[0];
  EXPECT_TRUE(mentions(plan.conflicts[0], "at most 2 ranks")) << plan.conflicts[0];
}

TEST(DeviceSelection, NarrowedVisibleDevicesConflict) {
  // A prolog that sets CUDA_VISIBLE_DEVICES=0 for every task of an 8-GPU node.
  const GpuPlan plan = plan_gpus(host_of("n2", 3, {"g0"}, "0"));
  ASSERT_EQ(plan.conflicts.size(), 1u);
  EXPECT_TRUE(mentions(plan.conflicts[0], "CUDA_VISIBLE_DEVICES '0'")) << plan.conflicts[0];
}

TEST(DeviceSelection, UnevenHostsNameOnlyTheShortOne) {
  const GpuPlan plan = plan_gpus(host_of("a", 2, {"g0", "g1"}) + host_of("b", 3, {"h0", "h1"}) +
                                 host_of("c", 1, {"k0"}));
  ASSERT_EQ(plan.conflicts.size(), 1u);
  EXPECT_TRUE(mentions(plan.conflicts[0], "b runs 3 ranks (2-4)")) << plan.conflicts[0];
  EXPECT_FALSE(mentions(plan.conflicts[0], "a runs")) << plan.conflicts[0];
}

TEST(DeviceSelection, RanksWithoutGpusNeverConflict) {
  const GpuPlan plan = plan_gpus(host_of("cpu1", 4, {}) + host_of("gpu1", 1, {"g0"}));
  EXPECT_EQ(plan.index, (std::vector<int>{-1, -1, -1, -1, 0}));
  EXPECT_TRUE(plan.conflicts.empty());
  EXPECT_FALSE(plan.every_rank_has_gpu());
}

TEST(DeviceSelection, RangesText) {
  EXPECT_EQ(ranges_text({0, 1, 2, 5}, ""), "0-2,5");
  EXPECT_EQ(ranges_text({3}, "cuda:"), "cuda:3");
  EXPECT_EQ(ranges_text({}, ""), "");
}

TEST(DeviceSelection, ParsesPreference) {
  EXPECT_EQ(parse_device_preference("auto"), DevicePreference::kAuto);
  EXPECT_EQ(parse_device_preference("cuda"), DevicePreference::kCuda);
  EXPECT_EQ(parse_device_preference("cpu"), DevicePreference::kCpu);
  EXPECT_THROW(parse_device_preference("tpu"), UsageError);
  EXPECT_THROW(parse_device_preference("gpu"), UsageError);  // one spelling, as myriad-train's
  for (const char* name : {"auto", "cpu", "cuda"})
    EXPECT_STREQ(to_string(parse_device_preference(name)), name);
}

TEST(DeviceSelection, FloatTypeOptionsNameTheKernelsElementTypes) {
  EXPECT_EQ(element_type(parse_float_dtype("fp32")), cuda::ElementType::kFloat32);
  EXPECT_EQ(element_type(parse_float_dtype("bfloat16")), cuda::ElementType::kBFloat16);
  EXPECT_EQ(element_type(parse_float_dtype("fp16")), cuda::ElementType::kFloat16);
  EXPECT_THROW(parse_float_dtype("fp8"), UsageError);
  for (const char* name : {"fp32", "bf16", "fp16"})
    EXPECT_STREQ(float_dtype_name(parse_float_dtype(name)), name);
  EXPECT_THROW(float_dtype_name(torch::kFloat64), Error);
  // Integer and double tensors have no kernel: the error names the type.
  try {
    element_type(torch::kFloat64);
    FAIL() << "float64 was given a kernel type";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Double"), std::string::npos) << e.what();
  }
  EXPECT_THROW(element_type(torch::kInt64), Error);
}

}  // namespace
}  // namespace myriad
