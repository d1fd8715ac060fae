#pragma once

#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <vector>

#include "myriad/train/pipeline_plan.h"
#include "myriad/train/step_observer.h"
#include "myriad/train/train_config.h"

namespace myriad {

class Communicator;
class DynamicLossScaler;
class GradientSynchronizer;
class MetricsLog;
class PhaseTimer;
class PipelineEngine;
class StragglerReport;

// The run's progress, one window of --log-every steps at a time (docs/training.md, "Logs and
// metrics"): the log line (loss, samples/s, the step's phases, the all-reduce hidden, the
// backbone's TFLOP/s, the peak memory of any rank, the ETA), the pipeline's stage times and
// bubble, fp16's skipped steps, and the same as one "train" record of metrics.jsonl (and so of
// TensorBoard), with the straggler report.
class ProgressReport : public StepObserver {
 public:
  // What the report reads, all owned by the run and outliving the report.
  struct Sources {
    const TrainConfig& config;
    torch::Device device;
    int world = 1;       // ranks
    int replicas = 1;    // data-parallel replicas (ranks / pipeline stages)
    Communicator& comm;  // all ranks, this device's tensors
    Communicator& mpi;   // all ranks, CPU tensors
    PhaseTimer& timer;
    GradientSynchronizer& sync;
    PipelineEngine& engine;
    DynamicLossScaler& scaler;
    StragglerReport& stragglers;
    MetricsLog& metrics;
    double backbone_multiply_adds = 0.0;  // per image
    // The balancer's forward + backward ms per micro-batch of each stage, when it profiled: the
    // report compares the stages with the figures of the mode they run in.
    StagePrediction predicted_stage_ms;
  };
  explicit ProgressReport(Sources sources);

  // At the run's first step (of this process: after a resume too).
  void run_started(const RunStart& e) override;
  // A step's wait for its batch.
  void batch_ready(const BatchReady& e) override { window_data_seconds_ += e.data_wait_seconds; }
  // Every --log-every steps and at the last, ends the window: the log line on rank 0 and the
  // metrics record (collective: every rank's peak memory and stage times are gathered).
  void step_finished(const StepEnd& e) override;
  // The run's last line: "done: N steps in 1h02m".
  void log_done() const;

 private:
  // With several stages or micro-batches: the pipeline's part of the line and the record.
  nlohmann::json pipeline_record(double step_seconds);
  void write(const StepEnd& e);
  // The window's figures, defined with the report.
  struct Window;
  // Measures the window ending at `e`; collective (every rank's peak memory).
  Window measure(const StepEnd& e);
  // The line rank 0 logs for the window.
  void log_line(const StepEnd& e, const Window& w) const;
  // fp16: the loss scale, and the steps skipped in the window (warned about); null otherwise.
  nlohmann::json loss_scale_record();
  // The window's metrics record.
  void write_metrics(const StepEnd& e, const Window& w, const nlohmann::json& pipeline,
                     const nlohmann::json& loss_scale) const;

  Sources s_;
  int64_t total_steps_ = 0;
  std::chrono::steady_clock::time_point run_start_;
  std::chrono::steady_clock::time_point window_start_;
  int64_t window_steps_ = 0;
  double window_data_seconds_ = 0.0;
};

}  // namespace myriad
