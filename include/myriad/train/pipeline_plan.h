#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "myriad/train/pipeline.h"
#include "myriad/train/train_config.h"

namespace myriad {

class Backbone;
class Communicator;

// How a run's backbone is cut into pipeline stages (docs/pipeline.md): the blocks each stage
// holds, the schedule, and the balancer's forward + backward ms per micro-batch of each stage
// (empty when nothing was profiled, which the progress report then leaves out).
struct PipelinePlan {
  std::vector<int64_t> cut;
  PipelineSchedule schedule = PipelineSchedule::kGPipe;
  std::vector<double> predicted_stage_ms;
};

// The plan for `config`: the whole backbone with one stage; the hand cut (--pipeline-split); or
// the fastest cut that fits in each GPU's memory beside the classifier's workspace, under the
// profile rank 0 takes of every block (at one micro-batch) and broadcasts over `mpi`, so that
// every rank computes the same plan. --pipeline-schedule auto takes GPipe unless only 1F1B's
// fewer micro-batches in flight fit. Collective when it profiles; logs the stages (and with
// --pipeline-profile every block).
PipelinePlan plan_pipeline(const TrainConfig& config, Backbone& backbone, Communicator& mpi,
                           int rank, const torch::Device& device,
                           std::optional<torch::ScalarType> autocast);

}  // namespace myriad
