#pragma once

// Which state-dict entries belong to a stage's blocks, shared by the pipeline engine, its block
// profiler and its checkpoint gather.

#include <torch/types.h>

#include <string>

#include "myriad/model/backbone.h"

namespace myriad {

// Whether state-dict entry `name` lies in blocks [begin, end).
bool in_blocks(const Backbone& backbone, const std::string& name, int64_t begin, int64_t end);

// Moves the state of blocks [begin, end) to `device` (parameters keep their identity).
void move_blocks(Backbone& backbone, int64_t begin, int64_t end, const torch::Device& device);

int64_t tensor_bytes(const torch::Tensor& t);

}  // namespace myriad
