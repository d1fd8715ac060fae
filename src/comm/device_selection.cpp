#include "myriad/comm/device_selection.h"

#include "myriad/util/error.h"

namespace myriad {

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

int choose_local_gpu(int local_rank, int local_size, int visible_gpus) {
  MYRIAD_CHECK(visible_gpus > 0, "no CUDA device is visible to this rank");
  MYRIAD_CHECK(local_rank >= 0 && local_rank < local_size, "local rank {} outside [0, {})",
               local_rank, local_size);
  if (visible_gpus == 1) return 0;
  MYRIAD_CHECK(local_rank < visible_gpus,
               "{} ranks run on this node but only {} GPUs are visible; start one rank per GPU",
               local_size, visible_gpus);
  return local_rank;
}

}  // namespace myriad
