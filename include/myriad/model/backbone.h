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

  // Stores the 4-D weights (convolutions) channels-last, or back in the default layout. With
  // channels-last weights and inputs, cuDNN runs its NHWC kernels, the fast ones for bf16 and fp16
  // on tensor cores; every layer between convolutions keeps the layout. The values do not change.
  void set_channels_last(bool on);
  bool channels_last() const { return channels_last_; }
  // `images` in the layout this backbone computes in (callers pass inputs through it).
  torch::Tensor in_layout(const torch::Tensor& images) const;

  // Multiply-adds of the convolutions and linear layers in one image's forward pass: a training
  // step costs about 3 x 2 x this many floating-point operations per image.
  int64_t multiply_adds() const { return multiply_adds_; }

 protected:
  // Constructors count each convolution and linear layer: its output positions (H x W; 1 for a
  // linear layer) times its weight's size (a dot product over the fan-in per output channel).
  void add_multiply_adds(int64_t n) { multiply_adds_ += n; }

 private:
  bool channels_last_ = false;
  int64_t multiply_adds_ = 0;
};

// The names make_backbone accepts.
const std::vector<std::string>& backbone_names();

// An unknown name, or an input shape the network cannot take, is a UsageError.
std::shared_ptr<Backbone> make_backbone(const BackboneOptions& options);

}  // namespace myriad
