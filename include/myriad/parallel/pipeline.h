#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "myriad/model/backbone.h"
#include "myriad/optim/optimizer_state.h"
#include "myriad/parallel/pipeline_balance.h"
#include "myriad/parallel/pipeline_schedule.h"

namespace myriad {

class Communicator;
class GradientSynchronizer;
class PhaseTimer;
class StageGraphs;
class StageTransfers;
class Timeline;

// Where this rank sits in a run of W = replicas x stages ranks (docs/pipeline.md): rank =
// replica * stages + stage, so that a pipeline's stages are neighbours on a node. The backbone is
// cut into stages x chunks virtual stages: virtual stage k holds blocks [cut[k], cut[k + 1]), and
// stage s holds chunks c = 0 .. chunks - 1, virtual stages c * stages + s (more than one chunk
// only under the interleaved schedule). One stage is plain data parallelism.
struct PipelineLayout {
  int stages = 1;
  int replicas = 1;
  int stage = 0;
  int replica = 0;
  int micro_batches = 1;
  int chunks = 1;
  PipelineSchedule schedule = PipelineSchedule::kGPipe;
  std::vector<int64_t> cut;

  // The world rank that pipeline_layout gave this layout.
  int rank() const { return replica * stages + stage; }
  // Whether this stage reads the images (virtual stage 0), and holds the embeddings (the last).
  bool first() const { return stage == 0; }
  bool last() const { return stage + 1 == stages; }
  // The neighbouring stages; interleaved, the first stage's previous is the last, whose next is
  // the first.
  int previous_stage() const { return (stage + stages - 1) % stages; }
  int next_stage() const { return (stage + 1) % stages; }
  int virtual_stage(int chunk) const { return chunk * stages + stage; }
  // Whether `chunk` takes the images, and gives the embeddings.
  bool takes_images(int chunk) const { return virtual_stage(chunk) == 0; }
  bool gives_embeddings(int chunk) const { return virtual_stage(chunk) + 1 == stages * chunks; }
  int64_t begin_block(int chunk) const { return cut.at(virtual_stage(chunk)); }
  int64_t end_block(int chunk) const { return cut.at(virtual_stage(chunk) + 1); }
  // Whether one of this stage's chunks holds block b.
  bool holds_block(int64_t b) const;
};

// The layout of `rank` among `world` ranks with `stages` stages; the cut is left to the caller.
PipelineLayout pipeline_layout(int world, int rank, int stages, int micro_batches);

// What a stage did since the last take_times().
struct PipelineTimes {
  double busy_seconds = 0.0;  // computing forward and backward (waits and transfers excluded)
  double bytes_sent = 0.0;    // activations, gradients and labels to neighbouring stages
  int64_t steps = 0;
};

// One rank's stage of the backbone, run over micro-batches on the layout's schedule
// (docs/pipeline.md): activations (and ViT's masking order and the samples' keys) go on to the
// next stage and their gradients back by point-to-point transfers, and the classifier runs on
// every rank in between, on the replica's whole batch (GPipe) or one micro-batch at a time
// (1F1B). With one stage and one micro-batch this is plain data-parallel training.
class PipelineEngine {
 public:
  // `pipe` connects the stages of this rank's replica (its rank there is the stage; none with one
  // stage). The backbone is whole on every rank; only this stage's blocks are moved to `device`
  // (place_stage).
  PipelineEngine(PipelineLayout layout, Backbone& backbone, std::unique_ptr<Communicator> pipe,
                 const torch::Device& device, std::optional<torch::ScalarType> autocast,
                 int64_t embedding_size);
  ~PipelineEngine();

  const PipelineLayout& layout() const { return layout_; }
  // Moves this stage's parameters and buffers to the device.
  void place_stage();
  // This stage's state-dict entries: what it trains (parameters) and keeps (buffers).
  StateDict stage_state();
  std::vector<torch::Tensor> stage_parameters();
  std::vector<torch::Tensor> stage_buffers();

  // The replica's labels, from the first stage (which loaded them) to the last (where the
  // classifier needs them); an empty [0] on the other stages.
  torch::Tensor route_labels(const torch::Tensor& labels);

  // This rank's rows of each micro-batch's classifier part under 1F1B, for
  // ShardedMarginSoftmax::begin_parts: its `labels` (route_labels) cut into equal micro-batches on
  // the last stage, none on the others.
  std::vector<int64_t> part_rows(const torch::Tensor& labels) const;

  // The classifier's part of a step: the loss of `embeddings` (a float32 leaf that requires
  // grad: [b, D] on the last stage, [0, D] elsewhere) with `labels` ([b], or [0]), its backward
  // run so that embeddings.grad() holds their gradient. Called on every rank of the run the same
  // number of times in the same order, since the classifier's collectives span all ranks.
  using ClassifierStep =
      std::function<torch::Tensor(const torch::Tensor& embeddings, const torch::Tensor& labels)>;
  // One step of the replica's batch through this stage on the layout's schedule: the first stage
  // passes its images and keys, the last its labels (route_labels). Gradients accumulate in
  // `sync`, which launches its all-reduces in the last backward pass. Returns the sum of what
  // `classify` returned: the loss, on every rank.
  torch::Tensor train_step(const torch::Tensor& images, const torch::Tensor& keys,
                           const torch::Tensor& labels, const ClassifierStep& classify,
                           GradientSynchronizer& sync);

  // Embeddings of `images` (on the first stage; ignored elsewhere) without gradients, for
  // evaluation: one batch through every stage, [batch, D] float32 on the last, [0, D] elsewhere.
  torch::Tensor infer(const torch::Tensor& images);

  // Clips the backbone's gradient to a global 2-norm of at most `max_norm` (as PyTorch's
  // clip_grad_norm_: a factor min(1, max_norm / (norm + 1e-6))), all on the device: no host
  // synchronisation. `gradients` hold this stage's gradients (GradientSynchronizer::buffers());
  // the norm sums over the stages. Returns the norm before clipping, a float64 [1] tensor.
  torch::Tensor clip_gradient_norm(const std::vector<torch::Tensor>& gradients, double max_norm);

  // Before a save, rank 0 (replica 0, stage 0) takes the other stages' parameters, buffers (into
  // its backbone) and optimizer states (returned) from replica 0's ranks; elsewhere nothing
  // happens and nothing is returned.
  std::vector<NamedParamState> gather_for_save(torch::optim::Optimizer& optimizer);

  PipelineTimes take_times();
  // Times the passes as "forward" and "backward" into `timer` (null: no timing).
  void set_phase_timer(PhaseTimer* timer) { timer_ = timer; }
  // Records each micro-batch's forward and backward, the classifier and the transfers into
  // `timeline` (null: none), for --timeline.
  void set_timeline(Timeline* timeline);
  // From the next step on, this stage's micro-batches run as CUDA graphs (StageGraphs), recorded
  // at that step: one slot per micro-batch the schedule holds at once; or, with false, eagerly,
  // and the graphs' memory is given back. A recording that runs out of memory turns them off.
  // Not with chunks (the interleaved schedule), which run eagerly.
  void use_cuda_graphs(bool on = true);
  // Whether this stage's micro-batches run as CUDA graphs (or will from the next step).
  bool cuda_graphs() const { return graphs_wanted_; }
  // Under 1F1B on GPUs the stages before the last run the classifier's parts beside their own
  // work, on a stream of their own (docs/pipeline.md, "Streams"). A stage whose passes run
  // collectives of their own (SyncBN) keeps them in its stream instead: NCCL kernels of two
  // communicators must never wait for each other on one GPU.
  void keep_parts_in_stream();

 private:
  struct MicroBatch;
  struct StepState;
  class BusyClock;
  void phase(const char* name);
  // The one executor of the schedule's actions (schedule_actions), in order.
  torch::Tensor run_schedule(const ClassifierStep& classify, GradientSynchronizer& sync);
  void run_action(const Action& action, StepState& state, const ClassifierStep& classify,
                  GradientSynchronizer& sync);
  // The step's inputs cut into micro-batches: images and keys (first stage), labels (last).
  void split_step(const torch::Tensor& images, const torch::Tensor& keys,
                  const torch::Tensor& labels);
  // Micro-batch m's input: its slice (first stage) or what the previous stage sent.
  Activations local_input(int m) const;
  // Where micro-batch m of `chunk` is kept in the step's per-micro-batch state.
  size_t item(int chunk, int m) const;
  // The chunk that the timeline names for a pass: -1 where a stage is one chunk.
  int traced_chunk(int chunk) const;
  // Whether state-dict entry `name` lies in this stage's blocks.
  bool holds(const std::string& name) const;
  Activations received_input(std::vector<torch::Tensor> got) const;
  // Forward of micro-batch m through `chunk` of this stage, its ends kept for backward; what goes
  // to the next stage (its wire form: activations, keys, masking order), or nothing where the
  // chunk gives the embeddings.
  std::vector<torch::Tensor> forward_micro_batch(int chunk, int m, Activations in);
  // The classifier on micro-batch `part` (or kWholeBatch): on the last stage its outputs and
  // labels, whose gradients go into `state`; elsewhere this rank's share (no samples). Its loss
  // is added to the state's.
  void run_classifier(int part, StepState& state, const ClassifierStep& classify);
  // The last stage's outputs of micro-batch `part` (or of all), detached, as the classifier's
  // input.
  torch::Tensor classifier_input(int part) const;
  // Backward of micro-batch m through `chunk` given its output's gradient (in wire form but where
  // the chunk gives the embeddings); the gradient of its input in wire form (undefined where it
  // takes the images). Frees its activations.
  torch::Tensor backward_micro_batch(int chunk, int m, const torch::Tensor& grad,
                                     GradientSynchronizer& sync, bool last_pass);

  PipelineLayout layout_;
  Backbone& backbone_;
  std::unique_ptr<Communicator> pipe_;
  torch::Device device_;
  std::optional<torch::ScalarType> autocast_;
  int64_t embedding_size_;
  std::vector<Action> actions_;  // this stage's, for every step
  std::vector<MicroBatch> micro_batches_;
  torch::Tensor labels_;  // the step's, on the last stage
  std::vector<torch::Tensor> image_parts_, key_parts_, label_parts_;
  std::unique_ptr<BusyClock> clock_;
  std::unique_ptr<StageTransfers> transfers_;
  PhaseTimer* timer_ = nullptr;
  Timeline* timeline_ = nullptr;
  // The graphs of this stage's micro-batches, or none, and how the schedule uses their slots.
  std::unique_ptr<StageGraphs> make_graphs();
  bool graphs_wanted_ = false;
  std::unique_ptr<StageGraphs> graphs_;
  int graph_slots_ = 0;
  GradientSynchronizer* step_sync_ = nullptr;  // the sync of the step under way
  int64_t steps_ = 0;
};

}  // namespace myriad
