#include "stage_checkpoint.h"

#include <map>
#include <string>

#include "myriad/comm/communicator.h"
#include "stage_blocks.h"

namespace myriad {

namespace {

// The optimizer state's tensors of each parameter, by name, as torch's optimizers keep them.
std::vector<std::string> state_names(torch::optim::Optimizer& optimizer) {
  const bool adamw = dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr;
  return adamw ? std::vector<std::string>{"exp_avg", "exp_avg_sq"}
               : std::vector<std::string>{"momentum_buffer"};
}

// Stage s's side: parameters and buffers of blocks [begin, end), each parameter followed by its
// state (a step, -1 for none, then its tensors).
void send_stage(Backbone& backbone, Communicator& pipe, torch::optim::Optimizer& optimizer,
                int64_t begin, int64_t end, const torch::Device& device) {
  const size_t tensors = state_names(optimizer).size();
  std::map<std::string, NamedParamState> mine;
  for (NamedParamState& state : named_param_states(optimizer, backbone))
    mine.emplace(state.param, std::move(state));
  for (const auto& [name, tensor] : backbone.state_dict()) {
    if (!in_blocks(backbone, name, begin, end)) continue;
    pipe.send({tensor.detach().contiguous()}, 0);
    if (!tensor.requires_grad()) continue;
    const auto it = mine.find(name);
    const int64_t step = it == mine.end() ? -1 : it->second.step;
    std::vector<torch::Tensor> message(tensors + 1);
    message[0] = torch::full({1}, step, torch::dtype(torch::kInt64).device(device));
    for (size_t k = 0; it != mine.end() && k < it->second.tensors.size(); ++k)
      message[k + 1] = it->second.tensors[k].second.contiguous();
    pipe.send(message, 0);
  }
}

// Stage 0's side of send_stage from stage s.
void receive_stage(Backbone& backbone, Communicator& pipe, const std::vector<std::string>& names,
                   int s, int64_t begin, int64_t end, std::vector<NamedParamState>& gathered) {
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : backbone.state_dict()) {
    if (!in_blocks(backbone, name, begin, end)) continue;
    tensor.copy_(pipe.recv({tensor.scalar_type()}, s)[0]);
    if (!tensor.requires_grad()) continue;
    std::vector<torch::ScalarType> dtypes = {torch::kInt64};
    for (size_t k = 0; k < names.size(); ++k) dtypes.push_back(torch::ScalarType::Undefined);
    const std::vector<torch::Tensor> message = pipe.recv(dtypes, s);
    const int64_t step = message[0].item<int64_t>();
    if (step < 0) continue;
    NamedParamState state{name, {}, step};
    for (size_t k = 0; k < names.size(); ++k) state.tensors.emplace_back(names[k], message[k + 1]);
    gathered.push_back(std::move(state));
  }
}

}  // namespace

std::vector<NamedParamState> gather_stages_for_save(const PipelineLayout& layout,
                                                    Backbone& backbone, Communicator& pipe,
                                                    torch::optim::Optimizer& optimizer,
                                                    const torch::Device& device) {
  std::vector<NamedParamState> gathered;
  if (layout.stages == 1 || layout.replica != 0) return gathered;
  // Stage by stage, chunk by chunk: virtual stage c P + s holds blocks [cut[c P + s], ... + 1).
  for (int s = 1; s < layout.stages; ++s) {
    for (int c = 0; c < layout.chunks; ++c) {
      const int k = c * layout.stages + s;
      const int64_t begin = layout.cut[k], end = layout.cut[k + 1];
      if (layout.stage == s) send_stage(backbone, pipe, optimizer, begin, end, device);
      if (layout.stage == 0)
        receive_stage(backbone, pipe, state_names(optimizer), s, begin, end, gathered);
    }
  }
  return gathered;
}

}  // namespace myriad
