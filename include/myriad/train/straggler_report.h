#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <string>
#include <vector>

#include "myriad/comm/process_context.h"
#include "myriad/train/step_observer.h"

namespace myriad {

// A straggler is a rank whose own work per step (compute: its step's time minus what it waited on
// other ranks, HangWatchdog::waited_seconds) is more than kStragglerThreshold above the median of
// all ranks. In a synchronous job every rank then waits for it, so one slow GPU or a throttled
// node slows the whole run; the report names it, with its host, before it costs the run.
//
// Each rank times its steps (from its batch to the step's end); report() runs once per log window:
// one MPI_Gather of one number per rank to rank 0, which logs a warning naming each straggler and
// returns the record for metrics.jsonl (null on the other ranks). A rank's figure is the median of
// its window's steps, so that one step descheduled by the system is not a straggler.
class StragglerReport : public StepObserver {
 public:
  static constexpr double kStragglerThreshold = 0.2;

  // Learns every rank's host (collective).
  explicit StragglerReport(const ProcessContext& context);

  void batch_ready(const BatchReady&) override;
  void step_finished(const StepEnd&) override;
  // Collective: every rank calls it at the same log window. Rank 0 gets
  // {"median_compute_ms", "compute_ms_per_rank", "stragglers": [{"rank", "host", "compute_ms",
  // "above_median"}]}, the others null; null everywhere when no step was timed.
  nlohmann::json report(int64_t step);

 private:
  using Clock = std::chrono::steady_clock;

  const ProcessContext& context_;
  std::vector<std::string> hosts_;  // rank 0's copy of every rank's host
  Clock::time_point step_start_;
  double waited_at_start_ = 0.0;
  std::vector<double> window_ms_;  // this rank's compute per step since the last report
};

// The ranks whose compute_ms is more than kStragglerThreshold above the median of all, in rank
// order, and that median.
struct Stragglers {
  double median_ms = 0.0;
  std::vector<int> ranks;
};
Stragglers find_stragglers(const std::vector<double>& compute_ms);

}  // namespace myriad
