#pragma once

#include "myriad/model/backbone.h"

namespace myriad {

// MobileFaceNet (Chen et al., 2018): a 3x3 stride-2 stem, a depthwise 3x3, inverted-residual
// bottlenecks (expansion, channels, repeats, stride) = (2,64,5,2) (4,128,1,2) (2,128,6,1)
// (4,128,1,2) (2,128,2,1), a 1x1 to 512 channels, a global depthwise convolution over the final
// H/16 x W/16 map and a linear 1x1 to the embedding, each followed by batch norm (PReLU after
// the non-linear ones). Input height and width must be divisible by 16. Not insightface's
// MobileFaceNet, which is `mbf` (mbf.h). Blocks: the two stem convolutions, each bottleneck, the
// head.
class MobileFaceNet final : public Backbone {
 public:
  explicit MobileFaceNet(const BackboneOptions& options);
  Activations forward_block(int64_t block, Activations in) override;
  std::string to_onnx(OnnxGraph& g, const std::string& x) const override;

 private:
  torch::nn::Sequential body_{nullptr};
  std::vector<int64_t> block_starts_;  // the first module of `body` of each block, then its size
};

}  // namespace myriad
