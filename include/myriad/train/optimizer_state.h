#pragma once

#include <torch/torch.h>

#include <memory>

namespace myriad {

// A LibTorch optimizer's state of one parameter (SGD momentum, AdamW moments), which LibTorch
// keys by the parameter's TensorImpl in a way that changed between releases. Null when the
// parameter has no state yet.
torch::optim::OptimizerParamState* find_param_state(torch::optim::Optimizer& optimizer,
                                                    const torch::Tensor& param);

void set_param_state(torch::optim::Optimizer& optimizer, const torch::Tensor& param,
                     std::unique_ptr<torch::optim::OptimizerParamState> state);

}  // namespace myriad
