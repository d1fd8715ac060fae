#include "myriad/optim/optimizer_state.h"

#include <sstream>
#include <string>
#include <type_traits>

#include "myriad/optim/multi_tensor_optimizer.h"

namespace myriad {

namespace {

using OptimizerStates = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
using StateKey = typename OptimizerStates::key_type;

// LibTorch 1.x keys state by the TensorImpl address printed to a string, 2.x by the address.
template <class Key = StateKey>
Key state_key(const torch::Tensor& p) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream text;
    text << static_cast<const void*>(p.unsafeGetTensorImpl());
    return text.str();
  } else {
    return p.unsafeGetTensorImpl();
  }
}

}  // namespace

torch::optim::OptimizerParamState* find_param_state(torch::optim::Optimizer& optimizer,
                                                    const torch::Tensor& param) {
  auto& states = optimizer.state();
  const auto it = states.find(state_key(param));
  return it == states.end() ? nullptr : it->second.get();
}

void set_param_state(torch::optim::Optimizer& optimizer, const torch::Tensor& param,
                     std::unique_ptr<torch::optim::OptimizerParamState> state) {
  optimizer.state()[state_key(param)] = std::move(state);
}

bool optimizer_holds(torch::optim::Optimizer& optimizer, const torch::Tensor& param) {
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& p : group.params()) {
      if (p.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return true;
    }
  }
  return false;
}

std::vector<NamedParamState> named_param_states(torch::optim::Optimizer& optimizer,
                                                torch::nn::Module& module) {
  const bool adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr;
  if (auto* skippable = dynamic_cast<SkippableStep*>(&optimizer)) skippable->settle();
  std::vector<NamedParamState> states;
  for (const auto& item : module.named_parameters()) {
    torch::optim::OptimizerParamState* state = find_param_state(optimizer, item.value());
    if (state == nullptr) continue;
    NamedParamState named{item.key(), {}, 0};
    if (adamw) {
      const auto& s = static_cast<torch::optim::AdamWParamState&>(*state);
      named.tensors = {{"exp_avg", s.exp_avg()}, {"exp_avg_sq", s.exp_avg_sq()}};
      named.step = s.step();
    } else {
      const auto& s = static_cast<torch::optim::SGDParamState&>(*state);
      if (!s.momentum_buffer().defined()) continue;
      named.tensors = {{"momentum_buffer", s.momentum_buffer()}};
    }
    states.push_back(std::move(named));
  }
  return states;
}

}  // namespace myriad
