#include "myriad/comm/device_selection.h"

#include <algorithm>
#include <map>
#include <set>

#include "myriad/util/error.h"
#include "myriad/util/format.h"
#include "myriad/util/strings.h"

#ifdef MYRIAD_WITH_CUDA
#include <cuda_runtime_api.h>

#include "myriad/util/check_cuda.h"
#endif

namespace myriad {

namespace {

// The conflict line of one host, or "" where each of its ranks has a GPU of its own.
std::string host_conflict(const std::string& host, const std::vector<int>& ranks,
                          const std::vector<RankGpus>& views, const std::vector<int>& index) {
  std::map<std::string, std::vector<int>> ranks_of_gpu;
  std::set<std::string> gpus;
  std::set<std::string> visible;
  for (const int r : ranks) {
    if (index[r] < 0) continue;
    ranks_of_gpu[views[r].gpus[index[r]]].push_back(r);
    gpus.insert(views[r].gpus.begin(), views[r].gpus.end());
    visible.insert(views[r].visible_devices.empty() ? "unset"
                                                    : "'" + views[r].visible_devices + "'");
  }
  std::vector<std::string> shared;
  for (const auto& [gpu, sharing] : ranks_of_gpu) {
    if (sharing.size() > 1)
      shared.push_back(str_format("ranks {} on {}", ranges_text(sharing, ""), gpu));
  }
  if (shared.empty()) return "";
  const size_t g = gpus.size();
  return str_format(
      "{} runs {} ranks ({}) but they see {} GPU{} (CUDA_VISIBLE_DEVICES {}): {} would share one "
      "GPU, which NCCL refuses; start at most {} rank{} on this host (mpirun -np {} on one host, "
      "or slots={} in a hostfile), give each rank a GPU of its own, or run on the CPU with "
      "--device cpu",
      host, ranks.size(), ranges_text(ranks, ""), g, g == 1 ? "" : "s",
      join(std::vector<std::string>(visible.begin(), visible.end()), "/"), join(shared, ", "), g,
      g == 1 ? "" : "s", g, g);
}

}  // namespace

DevicePreference parse_device_preference(const std::string& name) {
  // The names to_string gives, as myriad-train's --device takes them: one spelling everywhere.
  for (const DevicePreference p : kDevicePreferences) {
    if (name == to_string(p)) return p;
  }
  throw UsageError(str_format("unknown device '{}' (expected auto, cpu or cuda)", name));
}

const char* to_string(DevicePreference preference) {
  switch (preference) {
    case DevicePreference::kAuto:
      return "auto";
    case DevicePreference::kCpu:
      return "cpu";
    case DevicePreference::kCuda:
      return "cuda";
  }
  MYRIAD_THROW("no DevicePreference {}", static_cast<int>(preference));
}

bool GpuPlan::every_rank_has_gpu() const {
  return std::all_of(index.begin(), index.end(), [](int i) { return i >= 0; });
}

GpuPlan plan_gpus(const std::vector<RankGpus>& ranks) {
  GpuPlan plan;
  std::vector<std::string> hosts;
  std::map<std::string, std::vector<int>> ranks_of_host;
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankGpus& view = ranks[r];
    const int count = static_cast<int>(view.gpus.size());
    plan.index.push_back(count == 0 ? -1 : count == 1 ? 0 : view.local_rank % count);
    if (ranks_of_host[view.host].empty()) hosts.push_back(view.host);
    ranks_of_host[view.host].push_back(static_cast<int>(r));
  }
  for (const std::string& host : hosts) {
    const std::string line = host_conflict(host, ranks_of_host[host], ranks, plan.index);
    if (!line.empty()) plan.conflicts.push_back(line);
  }
  return plan;
}

std::vector<std::string> visible_gpu_uuids() {
  std::vector<std::string> uuids;
#ifdef MYRIAD_WITH_CUDA
  int count = 0;
  // No driver or no device is a host without GPUs, not an error.
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return uuids;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp properties{};
    MYRIAD_CHECK_CUDA(cudaGetDeviceProperties(&properties, i));
    std::string text = "GPU-";
    for (int b = 0; b < 16; ++b) {
      if (b == 4 || b == 6 || b == 8 || b == 10) text += '-';
      text += str_format(
          "{:02x}", static_cast<unsigned>(static_cast<unsigned char>(properties.uuid.bytes[b])));
    }
    uuids.push_back(text);
  }
#endif
  return uuids;
}

std::string ranges_text(const std::vector<int>& sorted, const std::string& prefix) {
  std::string text;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    text += (text.empty() ? "" : ",") + prefix + std::to_string(sorted[i]);
    if (j > i) text += "-" + std::to_string(sorted[j]);
    i = j + 1;
  }
  return text;
}

}  // namespace myriad
