#pragma once

#include "myriad/model/backbone.h"
#include "myriad/model/batch_norm.h"

namespace myriad {

// A small network for small images (28x28 Fashion-MNIST and the like): three 3x3 convolutions
// with batch norm and ReLU (32, 64, 128 channels; 2x2 max-pooling after the first two), dropout,
// a linear layer to the embedding and a final batch norm. It adapts to any input whose height
// and width are divisible by 4. Blocks: each convolution with what follows it, and the head.
class SmallCnn final : public Backbone {
 public:
  explicit SmallCnn(const BackboneOptions& options);
  Activations forward_block(int64_t block, Activations in) override;
  std::string to_onnx(OnnxGraph& g, const std::string& x) const override;

 private:
  torch::nn::Sequential features_{nullptr};
  torch::nn::Dropout dropout_{nullptr};
  torch::nn::Linear fc_{nullptr};
  BatchNorm embedding_{nullptr};
};

}  // namespace myriad
