#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace myriad {

// A LibTorch optimizer's state of one parameter (SGD momentum, AdamW moments), which LibTorch
// keys by the parameter's TensorImpl in a way that changed between releases. Null when the
// parameter has no state yet.
torch::optim::OptimizerParamState* find_param_state(torch::optim::Optimizer& optimizer,
                                                    const torch::Tensor& param);

void set_param_state(torch::optim::Optimizer& optimizer, const torch::Tensor& param,
                     std::unique_ptr<torch::optim::OptimizerParamState> state);

// Whether `optimizer` updates `param` (one of its parameter groups holds it).
bool optimizer_holds(torch::optim::Optimizer& optimizer, const torch::Tensor& param);

// One parameter's optimizer state as tensors by name (SGD: momentum_buffer; AdamW: exp_avg,
// exp_avg_sq) and AdamW's step count: what checkpoints store, and what pipeline stages hand to
// rank 0 before it saves.
struct NamedParamState {
  std::string param;  // the parameter's state-dict name
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  int64_t step = 0;
};

// The states `optimizer` holds for `module`'s parameters, in registration order; parameters
// without state yet are left out.
std::vector<NamedParamState> named_param_states(torch::optim::Optimizer& optimizer,
                                                torch::nn::Module& module);

}  // namespace myriad
