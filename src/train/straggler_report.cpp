#include "myriad/train/straggler_report.h"

#include <algorithm>

#include "myriad/comm/hang_watchdog.h"
#include "myriad/util/check_mpi.h"
#include "myriad/util/log.h"

namespace myriad {

namespace {

// The median; the mean of the two middle values for an even count.
double median(std::vector<double> values) {
  const size_t mid = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + mid, values.end());
  if (values.size() % 2 == 1) return values[mid];
  const double upper = values[mid];
  return (upper + *std::max_element(values.begin(), values.begin() + mid)) / 2.0;
}

}  // namespace

Stragglers find_stragglers(const std::vector<double>& compute_ms) {
  Stragglers found;
  if (compute_ms.empty()) return found;
  found.median_ms = median(compute_ms);
  for (size_t r = 0; r < compute_ms.size(); ++r) {
    if (compute_ms[r] > (1.0 + StragglerReport::kStragglerThreshold) * found.median_ms)
      found.ranks.push_back(static_cast<int>(r));
  }
  return found;
}

StragglerReport::StragglerReport(const ProcessContext& context)
    : context_(context), hosts_(context.all_gather_strings(context.hostname())) {}

void StragglerReport::batch_ready(const BatchReady&) {
  step_start_ = Clock::now();
  waited_at_start_ = HangWatchdog::instance().waited_seconds();
}

void StragglerReport::step_finished(const StepEnd&) {
  const double elapsed = std::chrono::duration<double>(Clock::now() - step_start_).count();
  const double waited = HangWatchdog::instance().waited_seconds() - waited_at_start_;
  window_ms_.push_back(1e3 * std::max(0.0, elapsed - waited));
}

nlohmann::json StragglerReport::report(int64_t step) {
  double mine = window_ms_.empty() ? -1.0 : median(window_ms_);
  window_ms_.clear();
  std::vector<double> all(context_.rank() == 0 ? context_.size() : 0);
  {
    const WaitScope wait("the straggler report's gather", "mpi", context_.size());
    MYRIAD_CHECK_MPI(
        MPI_Gather(&mine, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, 0, context_.world()));
  }
  if (context_.rank() != 0 || mine < 0) return nullptr;
  const Stragglers found = find_stragglers(all);
  nlohmann::json stragglers = nlohmann::json::array();
  for (const int r : found.ranks) {
    const double above = all[r] / found.median_ms - 1.0;
    log_warn(
        "straggler at step {}: rank {} on {} computes {:.1f} ms per step, {:.0f}% above the median "
        "{:.1f} ms of the {} ranks; every rank waits for it",
        step, r, hosts_[r], all[r], 100.0 * above, found.median_ms, all.size());
    stragglers.push_back(
        {{"rank", r}, {"host", hosts_[r]}, {"compute_ms", all[r]}, {"above_median", above}});
  }
  return {{"median_compute_ms", found.median_ms},
          {"compute_ms_per_rank", all},
          {"stragglers", stragglers}};
}

}  // namespace myriad
