#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "myriad/parallel/pipeline.h"
#include "myriad/train/train_config.h"

namespace myriad {

class Backbone;
class Communicator;

// The balancer's forward + backward ms per micro-batch of each stage, launched eagerly and replayed
// as CUDA graphs (empty when nothing was profiled, which the progress report then leaves out).
struct StagePrediction {
  std::vector<double> eager_ms;
  std::vector<double> replay_ms;
  const std::vector<double>& for_mode(bool cuda_graphs) const {
    return cuda_graphs ? replay_ms : eager_ms;
  }
};

// How a run's backbone is cut into pipeline stages (docs/pipeline.md): the blocks each stage
// holds, the schedule, and the stage times it predicts.
struct PipelinePlan {
  std::vector<int64_t> cut;  // of the stages x chunks virtual stages
  PipelineSchedule schedule = PipelineSchedule::kGPipe;
  int chunks = 1;  // per stage: more than one only interleaved
  StagePrediction predicted;
};

// The plan for `config`: the whole backbone with one stage; the hand cut (--pipeline-split); or
// the fastest cut that fits in the memory every GPU has beside the classifier's workspace (the
// least of any rank's, or --pipeline-memory), under the profile rank 0 takes of every block (at
// one micro-batch) and broadcasts over `mpi`, so that every rank computes the same plan. The cut
// balances the blocks' replayed times when the stages will likely replay CUDA graphs (--cuda-graphs
// on, or auto where graphs can run), else their eager times. --pipeline-schedule auto takes GPipe
// unless only 1F1B's fewer micro-batches in flight fit. Interleaved, it cuts P x v virtual stages
// (chunk c of stage s is virtual stage c P + s), the predicted time of a stage being its chunks'.
// Collective when it profiles; logs the stages (and with --pipeline-profile every block).
PipelinePlan plan_pipeline(const TrainConfig& config, Backbone& backbone, Communicator& mpi,
                           int rank, const torch::Device& device,
                           std::optional<torch::ScalarType> autocast);

}  // namespace myriad
