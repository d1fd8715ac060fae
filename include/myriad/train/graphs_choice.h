#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "myriad/parallel/pipeline.h"
#include "myriad/train/step_observer.h"
#include "myriad/train/train_config.h"

namespace myriad {

class Communicator;

// Whether a run of `config` on `device` can take CUDA graphs: a GPU, without SyncBN's collectives
// inside the forward and without activation checkpointing's recomputation.
bool cuda_graphs_possible(const TrainConfig& config, const torch::Device& device);

// Whether the run's micro-batches will likely replay CUDA graphs, for predictions made before the
// choice: --cuda-graphs on, or auto where graphs can run (what auto usually finds for pipeline
// stages' small, launch-bound micro-batches; its trial may still say no).
bool cuda_graphs_expected(const TrainConfig& config, const torch::Device& device);

// Whether the backbone's micro-batches run as CUDA graphs (--cuda-graphs; docs/training.md, "CUDA
// graphs"). on: from the first step. off: never. auto, where graphs can run (a GPU, no SyncBN, no
// activation checkpointing): measured, since graphs pay only where the host's kernel launches
// outlast the GPU's work (deep backbones, small micro-batches). The run's first step is eager
// (cuDNN's search, lazy initialisation); the next kTrialSteps are timed eagerly, one step records
// the graphs, and the kTrialSteps after it are timed replaying them. Graphs stay if the slowest
// rank's replayed step is more than kMargin faster than its eager one; otherwise their memory is
// given back. A recording that runs out of memory leaves the run eager (StageGraphs). Every rank
// takes the same decision; the choice and its figures are logged once.
class GraphsChoice : public StepObserver {
 public:
  static constexpr int kTrialSteps = 3;
  static constexpr double kMargin = 0.02;

  // `mode` is --cuda-graphs; `possible` whether this run's stage can run as graphs; `mpi` spans
  // every rank of the run.
  GraphsChoice(Toggle mode, bool possible, PipelineEngine& engine, Communicator& mpi,
               const torch::Device& device);
  // auto's rule, on the slowest rank's step times: graphs stay if they are more than kMargin
  // faster.
  static bool graphs_pay(double graph_seconds, double eager_seconds) {
    return graph_seconds < (1.0 - kMargin) * eager_seconds;
  }
  // How the start-up line names the choice: "", "CUDA graphs" or "CUDA graphs: auto".
  std::string describe() const;
  // Around each step of the run (collective at the end of the trial): sets the engine's mode for
  // the step, and times the trial's steps (waiting for the device at their end).
  void step_started(const StepStart&) override;
  void step_finished(const StepEnd&) override;

 private:
  enum class Phase { kFixed, kFirst, kEager, kRecord, kGraphs };
  void decide();

  PipelineEngine& engine_;
  Communicator& mpi_;
  torch::Device device_;
  Phase phase_ = Phase::kFixed;
  int steps_in_phase_ = 0;
  double eager_seconds_ = 0.0, graph_seconds_ = 0.0;  // summed over the timed steps
  std::chrono::steady_clock::time_point step_start_;
};

}  // namespace myriad
