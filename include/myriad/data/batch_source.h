#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>

#include "myriad/data/distributed_sampler.h"

namespace myriad {

struct Batch {
  int64_t index = 0;      // batches delivered before this one
  DataPosition position;  // of this batch
  DataPosition next;      // of the batch after it
  torch::Tensor images;   // float32 [b, C, H, W], (pixel / 127.5) - 1
  torch::Tensor labels;   // int64 [b]
};

// Where a training loop takes its batches from, one per step, in order.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual Batch next() = 0;
};

// The same batch every step, kept on the training device, with positions that advance as a
// loader's would: the trainer's own speed with no loading or host-to-device copy at all, as
// benchmarks measure it (`--data synthetic-resident`). A batch without images and labels gives
// the positions alone: what a rank that reads no data (a pipeline stage after the first) follows
// for its logs and checkpoints.
class ResidentBatch final : public BatchSource {
 public:
  ResidentBatch(Batch first, std::shared_ptr<const DistributedSampler> sampler,
                const torch::Device& device);
  Batch next() override;

 private:
  Batch batch_;
  std::shared_ptr<const DistributedSampler> sampler_;
};

}  // namespace myriad
