#include "myriad/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "myriad/util/error.h"

namespace myriad {

const char* to_string(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kPoly:
      return "poly";
    case LrScheduleKind::kCosine:
      return "cosine";
    case LrScheduleKind::kStep:
      return "step";
  }
  MYRIAD_THROW("no LrScheduleKind {}", static_cast<int>(kind));
}

double LrSchedule::factor(int64_t step) const {
  if (step < warmup_steps)
    return static_cast<double>(step + 1) / static_cast<double>(warmup_steps + 1);
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps));
  const double t = std::min(1.0, static_cast<double>(step - warmup_steps) / span);
  if (kind == LrScheduleKind::kCosine) return 0.5 * (1.0 + std::cos(M_PI * t));
  if (kind == LrScheduleKind::kStep) {
    const auto passed =
        std::upper_bound(milestones.begin(), milestones.end(), step) - milestones.begin();
    return std::pow(gamma, static_cast<double>(passed));
  }
  return std::pow(1.0 - t, power);
}

}  // namespace myriad
