#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "myriad/model/backbone.h"

namespace myriad {

class GradientSynchronizer;

// A pipeline stage's forward and backward of one micro-batch, each recorded once as a CUDA graph
// and replayed for every later micro-batch of the same shape (--cuda-graphs): the host launches
// two graphs instead of the thousands of kernels of a deep backbone, which at small micro-batches
// took longer to launch than to run (docs/pipeline.md, "Per-micro-batch overhead"). `slots`
// micro-batches can be in flight at once, each with its activations in its slot's graph memory:
// M under GPipe, min(P - s, M) under 1F1B.
//
// The backward graph adds each parameter's gradient into its place in the gradient buckets
// (GradientSynchronizer::gradient_views) and, when the stage has a previous one, gives the
// input's gradient. Recording runs the stage eagerly twice first (cuDNN's algorithm choice, the
// allocator's pools), then puts the batch-norm statistics back, so that a recorded step trains as
// the eager step does. It needs a CUDA device and no host synchronisation or collective inside the
// stage's blocks (so neither SyncBN nor activation checkpointing); a micro-batch of another shape
// is recorded anew.
class StageGraphs {
 public:
  StageGraphs(Backbone& backbone, int64_t begin_block, int64_t end_block,
              std::optional<torch::ScalarType> autocast, std::vector<torch::Tensor> params,
              bool input_grad, bool float32_output, int slots);
  ~StageGraphs();
  StageGraphs(const StageGraphs&) = delete;
  StageGraphs& operator=(const StageGraphs&) = delete;

  // Forward of a micro-batch in `slot`: the stage's output, in the slot's memory until the slot's
  // next forward. Records the slot's graphs first if needed, against `sync`'s buckets.
  Activations forward(int slot, const Activations& in, GradientSynchronizer& sync);
  // Backward of the slot's micro-batch given its output's gradient: adds the parameters' gradients
  // into the buckets and returns the input's gradient (undefined on the first stage), in the
  // slot's memory until its next backward.
  torch::Tensor backward(int slot, const torch::Tensor& output_grad);

 private:
  struct Slot;
  Activations run(const Activations& in) const;
  void record(Slot& slot, const Activations& in, GradientSynchronizer& sync);

  Backbone& backbone_;
  int64_t begin_;
  int64_t end_;
  std::optional<torch::ScalarType> autocast_;
  std::vector<torch::Tensor> params_;
  bool input_grad_;
  bool float32_output_;
  std::vector<std::unique_ptr<Slot>> slots_;
};

}  // namespace myriad
