#pragma once

#include "myriad/model/backbone.h"

namespace myriad {

// insightface arcface_torch's MobileFaceNet ("mbf", blocks (1, 4, 6, 2), scale 2), under its
// names: `layers` holds a 3x3 stride-2 stem of 128 channels, a 3x3 convolution of 64 groups, and
// then depthwise bottlenecks (1x1 expansion to `groups` channels, 3x3 depthwise, 1x1 linear
// projection), stride 2 where the resolution halves and residual in between:
// 128 -> 128 (x4 residual) -> 256 (x6) -> 256 (x2); then conv_sep (1x1 to 512) and the GDC head
// `features` (a 7x7 depthwise linear convolution, Linear(512 -> D, no bias), BN1d). Every
// convolution is followed by batch norm, and by PReLU unless linear. 112x112 inputs only.
//
// This is not myriad's own `mobilefacenet` (Chen et al.'s original layout), which stays beside it.
//
// Blocks: the stem, the grouped convolution, each bottleneck (the residual ones one by one), and
// conv_sep with the head.
class Mbf final : public Backbone {
 public:
  explicit Mbf(const BackboneOptions& options);
  Activations forward_block(int64_t block, Activations in) override;
  std::string to_onnx(OnnxGraph& g, const std::string& x) const override;

 private:
  torch::nn::ModuleList layers_{nullptr};
  std::shared_ptr<torch::nn::Module> conv_sep_;  // a convolution unit
  std::shared_ptr<torch::nn::Module> features_;  // the GDC head, its modules under `layers`
  // Block b runs layers_[unit_[b].first], or its member unit_[b].second when that is a residual
  // group (-1: the whole layer).
  std::vector<std::pair<int64_t, int64_t>> units_;
};

}  // namespace myriad
