#include "stage_blocks.h"

namespace myriad {

bool in_blocks(const Backbone& backbone, const std::string& name, int64_t begin, int64_t end) {
  const int64_t b = backbone.block_of(name);
  return begin <= b && b < end;
}

void move_blocks(Backbone& backbone, int64_t begin, int64_t end, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  for (auto& [name, tensor] : backbone.state_dict()) {
    if (in_blocks(backbone, name, begin, end) && tensor.device() != device)
      tensor.set_data(tensor.to(device));
  }
}

int64_t tensor_bytes(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

}  // namespace myriad
