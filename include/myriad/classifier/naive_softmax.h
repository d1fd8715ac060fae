#pragma once

#include <torch/types.h>

#include <memory>

#include "myriad/classifier/class_partition.h"
#include "myriad/classifier/sharded_softmax.h"

namespace myriad {

class Communicator;

// The common design myriad replaces, kept for the benchmark only: every rank computes its
// shard's logits, rank 0 gathers all [B, C] of them, computes the loss and the logits' gradient,
// and scatters the gradient back; each rank then stores its shard's full weight gradient before
// the optimizer step. Rank 0 therefore holds far more memory than the others.
class NaiveShardedSoftmax {
 public:
  NaiveShardedSoftmax(Communicator& comm, const ShardedSoftmaxOptions& options,
                      const torch::Device& device);

  // One training step (forward, backward, shard update) on local features; returns the loss on
  // every rank.
  torch::Tensor step(const torch::Tensor& features, const torch::Tensor& labels);

  const ClassPartition& partition() const { return partition_; }

 private:
  Communicator& comm_;
  ShardedSoftmaxOptions options_;
  torch::Device device_;
  ClassPartition partition_;
  torch::Tensor weight_;
  std::unique_ptr<ShardOptimizer> optimizer_;
};

}  // namespace myriad
