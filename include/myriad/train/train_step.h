#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "myriad/data/batch_source.h"
#include "myriad/optim/loss_scaler.h"
#include "myriad/parallel/buffer_broadcast.h"
#include "myriad/parallel/gradient_sync.h"
#include "myriad/parallel/pipeline.h"
#include "myriad/train/pipeline_plan.h"
#include "myriad/train/train_config.h"
#include "myriad/train/training_checkpoint.h"

namespace myriad {

class CommFactory;
class PhaseTimer;
class ProcessContext;
class ShardedMarginSoftmax;
class SkippableStep;

// One training step's parts: this rank's stage of the backbone on its engine, the sharded
// classifier, the synchroniser of the backbone's gradients, the loss scaler and the backbone's
// optimizer. TrainStepBuilder puts them together; every part exists from then on. Run::execute
// calls the phases in order: set_learning_rates, forward_backward, finish_gradients, update.
class TrainStep {
 public:
  // What the builder made, all of it present.
  struct Parts {
    torch::Device device{torch::kCPU};
    PipelineLayout layout;  // with its cut and schedule
    StagePrediction predicted_stage_ms;
    std::shared_ptr<Backbone> backbone;             // whole on every rank
    std::unique_ptr<Communicator> classifier_comm;  // with several stages; else the run's serves
    std::unique_ptr<ShardedMarginSoftmax> classifier;
    std::unique_ptr<Communicator> stage_comm;       // with several stages
    std::unique_ptr<Communicator> batch_norm_comm;  // with SyncBN
    std::unique_ptr<PipelineEngine> engine;
    // Shared with the CUDA graphs that record its all-reduces, which must not outlive it.
    std::shared_ptr<GradientSynchronizer> sync;
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    std::unique_ptr<BufferBroadcast> buffers;
  };
  // `comm` spans every rank (fp16's overflow flag is agreed there).
  TrainStep(const TrainConfig& config, Parts parts, Communicator& comm, PhaseTimer& timer);

  // The backbone's and the classifier's rates: their base rates times the schedule's `factor`.
  void set_learning_rates(double factor);
  // The replica's batch (`batch` and `keys` read on the first stage only) through this rank's stage
  // and the classifier, forward and backward, on the pipeline's schedule; `before_backward` runs
  // before each backward pass through the classifier, which updates its rows. Returns the loss.
  torch::Tensor forward_backward(const Batch& batch, const torch::Tensor& keys,
                                 const std::function<void()>& before_backward);
  // The backbone's gradients summed over the replicas, unscaled (fp16) and clipped. Returns fp16's
  // flag of a non-finite gradient on any rank (undefined otherwise).
  torch::Tensor finish_gradients();
  // The backbone's optimizer step unless `overflow`, and the loss scale's update.
  void update(const torch::Tensor& overflow);

  // What a checkpoint holds of the step's parts (without the step, position and configuration).
  TrainingState state();
  const PipelineLayout& layout() const { return layout_; }
  const StagePrediction& predicted_stage_ms() const { return predicted_stage_ms_; }
  Backbone& backbone() { return *backbone_; }
  PipelineEngine& engine() { return *engine_; }
  ShardedMarginSoftmax& classifier() { return *classifier_; }
  GradientSynchronizer& sync() { return *sync_; }
  DynamicLossScaler& scaler() { return scaler_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }

 private:
  const TrainConfig& c_;
  bool fp16_;  // the loss is scaled, and a non-finite gradient skips the step
  Communicator& comm_;
  PhaseTimer& timer_;
  torch::Device device_;
  PipelineLayout layout_;
  StagePrediction predicted_stage_ms_;
  std::shared_ptr<Backbone> backbone_;
  std::unique_ptr<Communicator> classifier_comm_;
  std::unique_ptr<ShardedMarginSoftmax> classifier_;
  std::unique_ptr<Communicator> stage_comm_;
  std::unique_ptr<Communicator> batch_norm_comm_;
  std::unique_ptr<PipelineEngine> engine_;
  std::shared_ptr<GradientSynchronizer> sync_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  SkippableStep& backbone_step_;  // optimizer_'s step
  std::unique_ptr<BufferBroadcast> buffers_;
  DynamicLossScaler scaler_;
};

// Builds a run's TrainStep from its configuration: the classifier first (a pipeline's cut must fit
// beside it in each GPU's memory), then the backbone and its stage, the optimizer, the gradients'
// synchroniser and the buffers' broadcast. Collective.
class TrainStepBuilder {
 public:
  // `config` outlives the step; `layout` is the run's ranks (pipeline_layout), without a cut.
  TrainStepBuilder(const ProcessContext& context, const TrainConfig& config,
                   const torch::Device& device, CommFactory& comms, PipelineLayout layout,
                   int64_t classes, PhaseTimer& timer);
  TrainStep build();

 private:
  void build_classifier(TrainStep::Parts& parts) const;
  void build_stage(TrainStep::Parts& parts) const;
  void build_gradient_parts(TrainStep::Parts& parts) const;
  // The ranks holding this rank's stage: the run's communicator with one stage.
  Communicator& stage_comm(const TrainStep::Parts& parts) const;
  // Each rank reads its rows of --init-classifier.
  void init_classifier(ShardedMarginSoftmax& classifier) const;

  const ProcessContext& context_;
  const TrainConfig& c_;
  torch::Device device_;
  CommFactory& comms_;
  PipelineLayout layout_;
  int64_t classes_;
  PhaseTimer& timer_;
  std::optional<torch::ScalarType> autocast_;
};

}  // namespace myriad
