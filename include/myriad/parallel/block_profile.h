#pragma once

#include <torch/types.h>

#include <optional>
#include <vector>

#include "myriad/model/backbone.h"
#include "myriad/parallel/pipeline_balance.h"

namespace myriad {

// Forward + backward time and activation memory of each block on `device`, one block at a time,
// from `sample` (a micro-batch of images and their keys) through every block, each run as a stage
// runs it (activation checkpointing included); then the launch times scaled to the whole
// backbone launched at once, where its activations fit (chained_launches). State bytes count
// parameters `state_factor` times (weights, gradients and optimizer state) plus buffers. The
// backbone's values, buffers and devices are as before afterwards. Activation memory is measured on
// CUDA devices and estimated from the blocks' outputs on the CPU.
std::vector<BlockCost> profile_blocks(Backbone& backbone, const Activations& sample,
                                      const torch::Device& device,
                                      std::optional<torch::ScalarType> autocast,
                                      double state_factor);

}  // namespace myriad
