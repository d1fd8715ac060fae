#pragma once

#include <array>
#include <string>
#include <vector>

namespace myriad {

enum class DevicePreference { kAuto, kCpu, kCuda };
// Every preference, in the order errors list them.
constexpr std::array<DevicePreference, 3> kDevicePreferences = {
    DevicePreference::kAuto, DevicePreference::kCpu, DevicePreference::kCuda};

// "auto", "cpu" or "cuda"; anything else is a UsageError.
DevicePreference parse_device_preference(const std::string& name);
// "auto", "cpu" or "cuda".
const char* to_string(DevicePreference preference);

// What one rank sees: its host, its local rank there, the UUIDs of the GPUs visible to it in
// CUDA's order, and CUDA_VISIBLE_DEVICES as it has it ("" where unset).
struct RankGpus {
  std::string host;
  int local_rank = 0;
  std::vector<std::string> gpus;
  std::string visible_devices;
};

// Which GPU each rank drives, as the ranks of every host agree on it.
struct GpuPlan {
  // Per rank, the index among its visible GPUs (-1: it sees none). One visible GPU means the
  // launcher gave the rank its own (srun --gpus-per-task=1, CUDA_VISIBLE_DEVICES per task);
  // otherwise local rank i takes GPU i (modulo the count, where a conflict names the excess).
  std::vector<int> index;
  // One line per host where two ranks would take one GPU (which NCCL refuses): the host, its
  // ranks, its GPUs and the ways out.
  std::vector<std::string> conflicts;

  bool every_rank_has_gpu() const;
};
GpuPlan plan_gpus(const std::vector<RankGpus>& ranks);

// The UUIDs ("GPU-8c3d...") of the CUDA devices this process sees, in CUDA's order; none on a
// build without CUDA or a host without GPUs.
std::vector<std::string> visible_gpu_uuids();

// "0-2,5" for {0, 1, 2, 5} (sorted), with `prefix` before each number.
std::string ranges_text(const std::vector<int>& sorted, const std::string& prefix);

}  // namespace myriad
