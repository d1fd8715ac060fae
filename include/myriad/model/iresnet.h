#pragma once

#include <vector>

#include "myriad/model/backbone.h"
#include "myriad/model/batch_norm.h"

namespace myriad {

// IResNet, insightface arcface_torch's r18 ... r200, under its names: a 3x3 stem (conv1, bn1,
// prelu), four stages layer1 ... layer4 of pre-activation basic blocks (bn1 - conv1 - bn2 - prelu
// - conv2 - bn3, plus the downsample shortcut) whose first block halves the resolution, and the
// bn2 - dropout - fc - features (BN1d) head. Built for 112x112 faces (7x7 before fc); other sizes
// divisible by 16 work too. Convolutions start from normal(0, 0.1), batch norms from (1, 0), and
// the scale of `features` stays fixed at 1, as in arcface_torch.
//
// Blocks (pipeline stages cut between them): the stem, each basic block, the head.
class IResNet final : public Backbone {
 public:
  // blocks per stage: {2,2,2,2} r18, {3,4,6,3} r34, {3,4,14,3} r50, {3,13,30,3} r100,
  // {6,26,60,6} r200.
  IResNet(const BackboneOptions& options, const std::vector<int64_t>& blocks);
  Activations forward_block(int64_t block, Activations in) override;
  std::vector<torch::Tensor> convolution_weights(int64_t block) const override;
  std::string to_onnx(OnnxGraph& g, const std::string& x) const override;
  // Before insightface's names: stem.{0,1,2} for conv1, bn1 and prelu, stages.N for layerK.J
  // (numbered through all stages), bn for bn2.
  std::string legacy_name(const std::string& name) const override;

 private:
  torch::nn::Conv2d conv1_{nullptr};
  BatchNorm bn1_{nullptr};
  torch::nn::PReLU prelu_{nullptr};
  torch::nn::Sequential layers_[4];  // layer1 ... layer4
  BatchNorm bn2_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  torch::nn::Linear fc_{nullptr};
  BatchNorm features_{nullptr};
};

}  // namespace myriad
