#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace myriad {

enum class LrScheduleKind { kPoly, kCosine, kStep };

// "poly", "cosine" or "step", as --lr-schedule spells them.
const char* to_string(LrScheduleKind kind);

// The learning-rate multiplier at each step: a linear warmup from 0 to 1 over `warmup_steps`,
// then poly (1 - t)^power, cosine (1 + cos(pi t)) / 2, or step (gamma to the number of
// milestones passed), where t runs from 0 to 1 over the steps after the warmup.
struct LrSchedule {
  LrScheduleKind kind = LrScheduleKind::kPoly;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double power = 2.0;
  std::vector<int64_t> milestones;
  double gamma = 0.1;

  // `step` counts from 0; the rate used for step `step`.
  double factor(int64_t step) const;
};

}  // namespace myriad
