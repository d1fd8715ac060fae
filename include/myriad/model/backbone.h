#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace myriad {

struct InputShape {
  int64_t channels = 3;
  int64_t height = 112;
  int64_t width = 112;
};

// "3x112x112" (channels x height x width); anything else is a UsageError.
InputShape parse_input_shape(const std::string& text);

struct BackboneOptions {
  std::string name = "iresnet50";
  InputShape input;
  int64_t embedding_size = 512;
  double dropout = 0.0;
};

// A network mapping images [B, C, H, W] to embeddings [B, D]. Replicated on every rank.
class Backbone : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& images) = 0;
};

// The names make_backbone accepts.
const std::vector<std::string>& backbone_names();

// An unknown name, or an input shape the network cannot take, is a UsageError.
std::shared_ptr<Backbone> make_backbone(const BackboneOptions& options);

}  // namespace myriad
