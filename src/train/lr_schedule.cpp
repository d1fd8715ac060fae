#include "myriad/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace myriad {

double LrSchedule::factor(int64_t step) const {
  if (step < warmup_steps)
    return static_cast<double>(step + 1) / static_cast<double>(warmup_steps + 1);
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double t = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
  if (kind == "cosine") return 0.5 * (1.0 + std::cos(M_PI * t));
  if (kind == "step") {
    const auto passed =
        std::upper_bound(milestones.begin(), milestones.end(), step) - milestones.begin();
    return std::pow(gamma, static_cast<double>(passed));
  }
  return std::pow(1.0 - t, power);
}

}  // namespace myriad
