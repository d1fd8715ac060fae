#pragma once

// A pipeline's stages brought to one rank for a save: rank 0 (replica 0, stage 0) writes the
// whole backbone and its optimizer state, which replica 0's other stages hold.

#include <torch/torch.h>

#include <vector>

#include "myriad/optim/optimizer_state.h"
#include "myriad/parallel/pipeline.h"

namespace myriad {

// On replica 0: stage 0 receives the other stages' parameters and buffers (into `backbone`) and
// returns their optimizer states; each other stage sends its own over `pipe`. Elsewhere nothing
// happens and nothing is returned.
std::vector<NamedParamState> gather_stages_for_save(const PipelineLayout& layout,
                                                    Backbone& backbone, Communicator& pipe,
                                                    torch::optim::Optimizer& optimizer,
                                                    const torch::Device& device);

}  // namespace myriad
