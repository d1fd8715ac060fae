#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "myriad/model/backbone.h"
#include "myriad/train/optimizer_state.h"
#include "myriad/train/pipeline_balance.h"

namespace myriad {

class Communicator;
class GradientSynchronizer;

// Where this rank sits in a run of W = replicas x stages ranks (docs/pipeline.md): rank =
// replica * stages + stage, so that a pipeline's stages are neighbours on a node. Stage s holds
// blocks [cut[s], cut[s + 1]) of the backbone. One stage is plain data parallelism.
struct PipelineLayout {
  int stages = 1;
  int replicas = 1;
  int stage = 0;
  int replica = 0;
  int micro_batches = 1;
  std::vector<int64_t> cut;

  bool first() const { return stage == 0; }
  bool last() const { return stage + 1 == stages; }
  int64_t begin_block() const { return cut.at(stage); }
  int64_t end_block() const { return cut.at(stage + 1); }
};

// The layout of `rank` among `world` ranks with `stages` stages; the cut is left to the caller.
PipelineLayout pipeline_layout(int world, int rank, int stages, int micro_batches);

// Micro-batches whose activations each stage keeps at once under the GPipe schedule: all of them,
// on every stage (all forwards, the classifier, then all backwards).
std::vector<int64_t> gpipe_in_flight(int stages, int micro_batches);

// Forward + backward time and activation memory of each block on `device`, one block at a time
// (so that a backbone too large for one device can be profiled), from `sample` (a micro-batch of
// images and their keys) through every block. State bytes count parameters `state_factor` times
// (weights, gradients and optimizer state) plus buffers. The backbone's values, buffers and
// devices are as before afterwards. Activation memory is measured on CUDA devices and estimated
// from the blocks' outputs on the CPU.
std::vector<BlockCost> profile_blocks(Backbone& backbone, const Activations& sample,
                                      const torch::Device& device,
                                      std::optional<torch::ScalarType> autocast,
                                      double state_factor);

// What a stage did since the last take_times().
struct PipelineTimes {
  double busy_seconds = 0.0;  // computing forward and backward (waits and transfers excluded)
  double bytes_sent = 0.0;    // activations, gradients and labels to neighbouring stages
  int64_t steps = 0;
};

// One rank's stage of the backbone, run over micro-batches on the GPipe schedule (design (a) of
// docs/pipeline.md): forward(): every micro-batch through this stage's blocks, activations (and
// ViT's masking order and the samples' keys) passed on by point-to-point sends; the classifier
// then runs once on the replica's whole batch of embeddings on the last stage; backward(): every
// micro-batch's backward, last first, gradients passed back. With one stage and one micro-batch
// this is plain data-parallel training.
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
  // classifier needs them); undefined on the other stages.
  torch::Tensor route_labels(const torch::Tensor& labels);
  // Forward of this step's micro-batches. The first stage passes the replica's images and keys.
  // The last stage gets the embeddings [batch, D] float32, the others an empty [0, D]: either
  // way a leaf that requires grad, for the classifier to fill its gradient.
  torch::Tensor forward(const torch::Tensor& images, const torch::Tensor& keys);
  // Backward of this step's micro-batches given the classifier's gradient of the embeddings;
  // gradients accumulate in `sync`, which launches its all-reduces in the last pass.
  void backward(const torch::Tensor& embeddings, GradientSynchronizer& sync);

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

 private:
  struct MicroBatch;
  class BusyClock;
  void send(const std::vector<torch::Tensor>& tensors, int peer);

  PipelineLayout layout_;
  Backbone& backbone_;
  std::unique_ptr<Communicator> pipe_;
  torch::Device device_;
  std::optional<torch::ScalarType> autocast_;
  int64_t embedding_size_;
  std::vector<MicroBatch> micro_batches_;
  std::unique_ptr<BusyClock> clock_;
  double bytes_sent_ = 0.0;
  int64_t steps_ = 0;
};

}  // namespace myriad
