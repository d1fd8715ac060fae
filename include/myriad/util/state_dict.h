#pragma once

#include <torch/types.h>

#include <string>
#include <utility>
#include <vector>

namespace myriad {

// Tensors by name, in order: a module's parameters and buffers, as PyTorch's state_dict().
using StateDict = std::vector<std::pair<std::string, torch::Tensor>>;

}  // namespace myriad
