#include <gtest/gtest.h>

#include "myriad/comm/device_selection.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"

namespace myriad {
namespace {

TEST(DeviceSelection, MapsLocalRankToGpu) {
  EXPECT_EQ(choose_local_gpu(0, 4, 4), 0);
  EXPECT_EQ(choose_local_gpu(3, 4, 4), 3);
  EXPECT_EQ(choose_local_gpu(1, 2, 8), 1);
}

TEST(DeviceSelection, OneVisibleGpuMeansTheLauncherAssignedIt) {
  // srun --gpus-per-task=1 or CUDA_VISIBLE_DEVICES per task: every rank sees its own GPU as 0.
  EXPECT_EQ(choose_local_gpu(3, 4, 1), 0);
}

TEST(DeviceSelection, MoreRanksThanGpusIsAnError) {
  EXPECT_THROW(choose_local_gpu(2, 4, 2), Error);
  EXPECT_THROW(choose_local_gpu(0, 1, 0), Error);
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
