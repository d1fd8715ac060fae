#include "myriad/train/optimizer_state.h"

#include <sstream>
#include <string>
#include <type_traits>

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

}  // namespace myriad
