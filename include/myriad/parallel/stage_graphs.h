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
// took longer to launch than to run (docs/pipeline.md, "Per-micro-batch overhead"). Each slot
// holds one micro-batch in flight, its activations in its graphs' memory pool: M slots under
// GPipe, min(P - s, M) under 1F1B (docs/training.md, "CUDA graphs").
//
// The backward graph adds each parameter's gradient into its place in the gradient buckets, in
// place (GradientSynchronizer::GraphBackward), and gives the input's gradient when the stage has
// a previous one. A slot whose micro-batch is the step's last backward pass has a second backward
// graph that also all-reduces each bucket as soon as it is full, overlapped with the rest of the
// backward as in an eager step (when the synchroniser runs on NCCL; otherwise the all-reduces
// follow the replay).
//
// Recording runs the stage eagerly twice first (cuDNN's algorithm choice, the allocator's pools),
// gives the allocator's cached memory back so that the graphs' pools can take it, and puts the
// batch-norm statistics back, so that a recorded step trains as the eager step does. If it runs
// out of memory on any rank of the synchroniser, nothing stays recorded on any of them and
// prepare() says so: the caller goes on eagerly. It needs a CUDA device and no host
// synchronisation or collective inside the stage's blocks (so neither SyncBN nor activation
// checkpointing).
class StageGraphs {
 public:
  // How the schedule uses a slot: for the step's last backward pass, for other passes, or both.
  struct SlotUse {
    bool last_pass = false;
    bool other_passes = false;
  };
  StageGraphs(Backbone& backbone, int64_t begin_block, int64_t end_block,
              std::optional<torch::ScalarType> autocast, std::vector<torch::Tensor> params,
              bool input_grad, bool float32_output, std::vector<SlotUse> slots);
  ~StageGraphs();
  StageGraphs(const StageGraphs&) = delete;
  StageGraphs& operator=(const StageGraphs&) = delete;

  // Before a forward of micro-batch `in`: records every slot's graphs for its shape against
  // `sync`'s buckets, unless they are recorded for it already (collective among `sync`'s ranks
  // when it records). False if recording ran out of memory on any of them: then nothing is
  // recorded, the memory it took is given back, and the micro-batches must run eagerly.
  bool prepare(const Activations& in, GradientSynchronizer& sync);
  // Forward of a micro-batch in `slot`: the stage's output, in the slot's memory until the slot's
  // next forward.
  Activations forward(int slot, const Activations& in);
  // Backward of the slot's micro-batch given its output's gradient: adds the parameters' gradients
  // into the buckets (and all-reduces them, if `last_pass` and all_reduces_last()) and returns the
  // input's gradient (undefined on the first stage), in the slot's memory until its next backward.
  torch::Tensor backward(int slot, const torch::Tensor& output_grad, bool last_pass);
  // Whether the last pass's replay all-reduces the buckets itself.
  bool all_reduces_last() const { return all_reduces_last_; }

 private:
  struct Slot;
  Activations run(const Activations& in) const;
  bool recorded_for(const Activations& in) const;
  void record_all(const Activations& in, GradientSynchronizer& sync);
  void record(Slot& slot, const Activations& in, GradientSynchronizer& sync);

  Backbone& backbone_;
  int64_t begin_;
  int64_t end_;
  std::optional<torch::ScalarType> autocast_;
  std::vector<torch::Tensor> params_;
  bool input_grad_;
  bool float32_output_;
  std::vector<SlotUse> uses_;
  // The synchroniser whose all-reduces and events the slots' graphs replay: kept while they exist.
  std::shared_ptr<GradientSynchronizer> recorded_with_;
  std::vector<std::unique_ptr<Slot>> slots_;  // empty until recorded
  bool all_reduces_last_ = false;
};

}  // namespace myriad
