#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>

#include "myriad/parallel/pipeline.h"
#include "myriad/train/step_observer.h"
#include "myriad/train/train_config.h"
#include "myriad/util/timeline.h"

namespace myriad {

class ProcessContext;

// The steps of --profile-steps FIRST:LAST (as the log counts them): on GPUs inside the CUDA
// profiler's capture range, for nsys and ncu; and with --timeline, every rank's micro-batches,
// classifier and transfers recorded (Timeline) and written by rank 0 as one Chrome trace once the
// last of them, or the run's last step, is done (docs/pipeline.md, "Timeline").
class StepProfiler : public StepObserver {
 public:
  // Checks (collectively) that the timeline's file can be written.
  StepProfiler(const ProcessContext& context, const TrainConfig& config,
               const torch::Device& device, PipelineEngine& engine);

  // Collective while a timeline is recorded: the ranks meet at each traced step's start.
  void step_started(const StepStart& e) override;
  // Collective at the last traced step, where the timeline is gathered and written.
  void step_finished(const StepEnd& e) override;

 private:
  bool profiled(int64_t step) const { return step + 1 >= first_ && step + 1 <= last_; }
  void write_timeline();

  const ProcessContext& context_;
  torch::Device device_;
  PipelineEngine& engine_;
  int64_t first_ = 0, last_ = 0;  // 0: no step
  std::string path_;              // the timeline's file; empty: none
  std::string process_;           // this rank's name in it
  bool started_ = false;
  int64_t traced_from_ = 0;  // the first step this run profiled
  std::optional<Timeline> timeline_;
};

}  // namespace myriad
