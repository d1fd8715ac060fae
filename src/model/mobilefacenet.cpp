#include "myriad/model/mobilefacenet.h"

#include <string>

#include "myriad/model/batch_norm.h"
#include "myriad/model/onnx_graph.h"
#include "myriad/util/error.h"

namespace myriad {

namespace {

// Appends a convolution and batch norm, then PReLU unless `linear`. Returns the convolution's
// multiply-adds at an input of `positions` pixels, and divides `positions` by its stride squared.
int64_t add_conv_block(torch::nn::Sequential& layers, int64_t& positions, int64_t in, int64_t out,
                       torch::ExpandingArray<2> kernel, int64_t stride, int64_t groups,
                       bool linear) {
  torch::nn::Conv2d conv(
      torch::nn::Conv2dOptions(in, out, kernel)
          .stride(stride)
          .padding(torch::ExpandingArray<2>({(*kernel)[0] / 2, (*kernel)[1] / 2}))
          .groups(groups)
          .bias(false));
  layers->push_back(conv);
  layers->push_back(BatchNorm(out));
  if (!linear) layers->push_back(torch::nn::PReLU(torch::nn::PReLUOptions().num_parameters(out)));
  positions /= stride * stride;
  return positions * conv->weight.numel();
}

class BottleneckImpl : public torch::nn::Module, public OnnxModule {
 public:
  // `positions`: pixels of the input, then of the output; `multiply_adds` accumulates.
  BottleneckImpl(int64_t in, int64_t out, int64_t expansion, int64_t stride, int64_t& positions,
                 int64_t& multiply_adds)
      : residual_(stride == 1 && in == out) {
    const int64_t hidden = in * expansion;
    body_ = register_module("body", torch::nn::Sequential());
    multiply_adds += add_conv_block(body_, positions, in, hidden, 1, 1, 1, false);
    multiply_adds += add_conv_block(body_, positions, hidden, hidden, 3, stride, hidden, false);
    multiply_adds += add_conv_block(body_, positions, hidden, out, 1, 1, 1, true);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = body_->forward(x);
    return residual_ ? x + y : y;
  }
  std::string to_onnx(OnnxGraph& g, const std::string& x, const std::string& name) const override {
    const std::string y = onnx_layers::sequential(g, x, *body_, name + ".body");
    return residual_ ? g.node("Add", name + ".add", {x, y}) : y;
  }

 private:
  bool residual_;
  torch::nn::Sequential body_{nullptr};
};
TORCH_MODULE(Bottleneck);

}  // namespace

MobileFaceNet::MobileFaceNet(const BackboneOptions& options) {
  const InputShape& in = options.input;
  if (in.height % 16 != 0 || in.width % 16 != 0) {
    throw UsageError(
        str_format("mobilefacenet needs an input height and width divisible by 16, got {}x{}",
                   in.height, in.width));
  }
  body_ = register_module("body", torch::nn::Sequential());
  int64_t positions = in.height * in.width;
  int64_t macs = add_conv_block(body_, positions, in.channels, 64, 3, 2, 1, false);
  macs += add_conv_block(body_, positions, 64, 64, 3, 1, 64, false);
  struct Stage {
    int64_t expansion, channels, repeats, stride;
  };
  // Block b runs modules [block_starts_[b], block_starts_[b + 1]) of body_.
  block_starts_.push_back(0);
  int64_t channels = 64;
  for (const Stage& s : {Stage{2, 64, 5, 2}, Stage{4, 128, 1, 2}, Stage{2, 128, 6, 1},
                         Stage{4, 128, 1, 2}, Stage{2, 128, 2, 1}}) {
    for (int64_t r = 0; r < s.repeats; ++r) {
      block_starts_.push_back(static_cast<int64_t>(body_->size()));
      body_->push_back(
          Bottleneck(channels, s.channels, s.expansion, r == 0 ? s.stride : 1, positions, macs));
      channels = s.channels;
    }
  }
  block_starts_.push_back(static_cast<int64_t>(body_->size()));
  macs += add_conv_block(body_, positions, 128, 512, 1, 1, 1, false);
  // Global depthwise convolution: one weight per position of the final map, one output position.
  torch::nn::Conv2d gdc(
      torch::nn::Conv2dOptions(512, 512, torch::ExpandingArray<2>({in.height / 16, in.width / 16}))
          .groups(512)
          .bias(false));
  torch::nn::Conv2d linear(torch::nn::Conv2dOptions(512, options.embedding_size, 1).bias(false));
  body_->push_back(gdc);
  body_->push_back(BatchNorm(512));
  body_->push_back(linear);
  body_->push_back(BatchNorm(options.embedding_size));
  add_multiply_adds(macs + gdc->weight.numel() + linear->weight.numel());
  block_starts_.push_back(static_cast<int64_t>(body_->size()));
  for (size_t b = 0; b + 1 < block_starts_.size(); ++b) {
    std::vector<std::string> prefixes;
    for (int64_t k = block_starts_[b]; k < block_starts_[b + 1]; ++k)
      prefixes.push_back("body." + std::to_string(k));
    add_block(b == 0                          ? "stem"
              : b + 2 == block_starts_.size() ? "head"
                                              : prefixes.front(),
              prefixes);
  }
  torch::NoGradGuard no_grad;
  for (auto& module : modules(false)) {
    if (auto* c = module->as<torch::nn::Conv2d>())
      torch::nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut);
  }
}

std::string MobileFaceNet::to_onnx(OnnxGraph& g, const std::string& x) const {
  return g.node("Flatten", "flatten", {onnx_layers::sequential(g, x, *body_, "body")},
                {{"axis", int64_t{1}}});
}

Activations MobileFaceNet::forward_block(int64_t block, Activations in) {
  for (auto module = body_->begin() + block_starts_.at(block);
       module != body_->begin() + block_starts_.at(block + 1); ++module) {
    in.x = module->forward(in.x);
  }
  if (block + 1 == num_blocks()) in.x = in.x.flatten(1);
  return in;
}

}  // namespace myriad
