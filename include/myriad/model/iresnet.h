#pragma once

#include <vector>

#include "myriad/model/backbone.h"
#include "myriad/model/batch_norm.h"

namespace myriad {

// IResNet (insightface's ArcFace backbones): a 3x3 stem, four stages of pre-activation basic
// blocks (BN - conv3x3 - BN - PReLU - conv3x3 - BN, plus the shortcut) that halve the resolution,
// and the BN - dropout - FC - BN embedding head. Built for 112x112 faces (7x7 before the FC);
// other sizes divisible by 16 work too. Convolutions start from normal(0, 0.1), batch norms from
// (1, 0), and the final BN's scale stays fixed at 1, as in the reference training recipe.
class IResNet final : public Backbone {
 public:
  // blocks per stage: {2,2,2,2} iresnet18, {3,4,6,3} iresnet34, {3,4,14,3} iresnet50,
  // {3,13,30,3} iresnet100.
  IResNet(const BackboneOptions& options, const std::vector<int64_t>& blocks);
  torch::Tensor forward(const torch::Tensor& images) override;

 private:
  torch::nn::Sequential stem_{nullptr};
  torch::nn::Sequential stages_{nullptr};
  BatchNorm bn_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  torch::nn::Linear fc_{nullptr};
  BatchNorm features_{nullptr};
};

}  // namespace myriad
