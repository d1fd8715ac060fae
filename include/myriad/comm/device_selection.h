#pragma once

#include <array>
#include <string>

namespace myriad {

enum class DevicePreference { kAuto, kCpu, kCuda };
// Every preference, in the order errors list them.
constexpr std::array<DevicePreference, 3> kDevicePreferences = {
    DevicePreference::kAuto, DevicePreference::kCpu, DevicePreference::kCuda};

// "auto", "cpu" or "cuda"; anything else is a UsageError.
DevicePreference parse_device_preference(const std::string& name);
// "auto", "cpu" or "cuda".
const char* to_string(DevicePreference preference);

// Index, among the GPUs this process can see, that the rank with `local_rank` of `local_size`
// ranks on its node drives. One visible GPU means the launcher already gave each task its own
// (CUDA_VISIBLE_DEVICES per task, srun --gpus-per-task=1); otherwise ranks map to GPUs by local
// rank, and more ranks than GPUs is an error because NCCL refuses two ranks on one GPU.
int choose_local_gpu(int local_rank, int local_size, int visible_gpus);

}  // namespace myriad
