#include "myriad/model/mbf.h"

#include <string>

#include "myriad/model/batch_norm.h"
#include "myriad/model/onnx_graph.h"
#include "myriad/util/error.h"

namespace myriad {

namespace {

// Conv2d (no bias) and BatchNorm2d, then PReLU unless `linear`, as `layers` (arcface_torch's
// ConvBlock and LinearBlock). `side` is the square map's side, in then out; `multiply_adds`
// accumulates.
class ConvUnitImpl : public torch::nn::Module, public OnnxModule {
 public:
  ConvUnitImpl(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t groups, bool linear,
               int64_t& side, int64_t& multiply_adds) {
    layers_ = register_module("layers", torch::nn::Sequential());
    torch::nn::Conv2d conv(torch::nn::Conv2dOptions(in, out, kernel)
                               .stride(stride)
                               .padding(kernel == 3 ? 1 : 0)
                               .groups(groups)
                               .bias(false));
    conv_ = conv;
    bn_ = BatchNorm(out);
    layers_->push_back(conv_);
    layers_->push_back(bn_);
    if (!linear) {
      prelu_ = torch::nn::PReLU(torch::nn::PReLUOptions().num_parameters(out));
      layers_->push_back(prelu_);
    }
    const int64_t padding = kernel == 3 ? 1 : 0;
    side = (side + 2 * padding - kernel) / stride + 1;
    multiply_adds += side * side * conv->weight.numel();
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const torch::Tensor y = conv_(x);
    return prelu_ ? bn_->forward_prelu(y, prelu_->weight) : bn_(y);
  }
  std::string to_onnx(OnnxGraph& g, const std::string& x, const std::string& name) const override {
    return onnx_layers::sequential(g, x, *layers_, name + ".layers");
  }

 private:
  torch::nn::Sequential layers_{nullptr};  // holds the three, for their state-dict names
  torch::nn::Conv2d conv_{nullptr};
  BatchNorm bn_{nullptr};
  torch::nn::PReLU prelu_{nullptr};
};
TORCH_MODULE(ConvUnit);

// 1x1 to `groups` channels, 3x3 depthwise, 1x1 linear to `out` (arcface_torch's DepthWise).
class DepthWiseImpl : public torch::nn::Module, public OnnxModule {
 public:
  DepthWiseImpl(int64_t in, int64_t out, int64_t stride, int64_t groups, bool residual,
                int64_t& side, int64_t& multiply_adds)
      : residual_(residual) {
    layers_ = register_module("layers", torch::nn::Sequential());
    layers_->push_back(ConvUnit(in, groups, 1, 1, 1, false, side, multiply_adds));
    layers_->push_back(ConvUnit(groups, groups, 3, stride, groups, false, side, multiply_adds));
    layers_->push_back(ConvUnit(groups, out, 1, 1, 1, true, side, multiply_adds));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = layers_->forward(x);
    return residual_ ? x + y : y;
  }
  std::string to_onnx(OnnxGraph& g, const std::string& x, const std::string& name) const override {
    const std::string y = onnx_layers::sequential(g, x, *layers_, name + ".layers");
    return residual_ ? g.node("Add", name + ".add", {x, y}) : y;
  }

 private:
  bool residual_;
  torch::nn::Sequential layers_{nullptr};
};
TORCH_MODULE(DepthWise);

// `count` residual DepthWise units of `channels` (arcface_torch's Residual).
torch::nn::Sequential residual_group(int64_t channels, int64_t count, int64_t groups, int64_t& side,
                                     int64_t& multiply_adds) {
  torch::nn::Sequential units;
  for (int64_t i = 0; i < count; ++i)
    units->push_back(DepthWise(channels, channels, 1, groups, true, side, multiply_adds));
  return units;
}

// A module holding `units` as its `layers`, so that names read layers.K.layers.J.
class GroupImpl : public torch::nn::Module, public OnnxModule {
 public:
  explicit GroupImpl(torch::nn::Sequential units) {
    layers_ = register_module("layers", std::move(units));
  }
  torch::nn::Sequential& layers() { return layers_; }
  std::string to_onnx(OnnxGraph& g, const std::string& x, const std::string& name) const override {
    return onnx_layers::sequential(g, x, *layers_, name + ".layers");
  }

 private:
  torch::nn::Sequential layers_{nullptr};
};
TORCH_MODULE(Group);

}  // namespace

Mbf::Mbf(const BackboneOptions& options) {
  const InputShape& in = options.input;
  if (in.height != 112 || in.width != 112 || in.channels != 3) {
    throw UsageError(str_format("mbf takes 3x112x112 inputs only, got {}x{}x{}", in.channels,
                                in.height, in.width));
  }
  int64_t side = in.height;
  int64_t macs = 0;
  layers_ = register_module("layers", torch::nn::ModuleList());
  layers_->push_back(ConvUnit(3, 128, 3, 2, 1, false, side, macs));
  layers_->push_back(ConvUnit(128, 128, 3, 1, 64, false, side, macs));
  layers_->push_back(DepthWise(128, 128, 2, 128, false, side, macs));
  layers_->push_back(Group(residual_group(128, 4, 128, side, macs)));
  layers_->push_back(DepthWise(128, 256, 2, 256, false, side, macs));
  layers_->push_back(Group(residual_group(256, 6, 256, side, macs)));
  layers_->push_back(DepthWise(256, 256, 2, 512, false, side, macs));
  layers_->push_back(Group(residual_group(256, 2, 256, side, macs)));
  conv_sep_ = register_module("conv_sep", ConvUnit(256, 512, 1, 1, 1, false, side, macs).ptr());
  // GDC: a 7x7 depthwise linear convolution to one position, flatten, Linear, BN1d.
  torch::nn::Linear linear(torch::nn::LinearOptions(512, options.embedding_size).bias(false));
  features_ = register_module(
      "features",
      Group(torch::nn::Sequential(ConvUnit(512, 512, 7, 1, 512, true, side, macs),
                                  torch::nn::Flatten(), linear, BatchNorm(options.embedding_size)))
          .ptr());
  add_multiply_adds(macs + linear->weight.numel());

  for (int64_t k = 0; k < static_cast<int64_t>(layers_->size()); ++k) {
    const std::string name = "layers." + std::to_string(k);
    if (auto* group = layers_[k]->as<GroupImpl>()) {
      for (int64_t j = 0; j < static_cast<int64_t>(group->layers()->size()); ++j) {
        units_.emplace_back(k, j);
        add_block(name + ".layers." + std::to_string(j), {name + ".layers." + std::to_string(j)});
      }
    } else {
      units_.emplace_back(k, -1);
      add_block(name, {name});
    }
  }
  units_.emplace_back(-1, -1);
  add_block("head", {"conv_sep", "features"});

  torch::NoGradGuard no_grad;
  for (auto& module : modules(false)) {
    if (auto* c = module->as<torch::nn::Conv2d>())
      torch::nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
  }
  torch::nn::init::kaiming_normal_(linear->weight, 0.0, torch::kFanOut, torch::kReLU);
}

std::string Mbf::to_onnx(OnnxGraph& g, const std::string& x) const {
  std::string y = x;
  const auto layers = layers_->children();
  for (size_t k = 0; k < layers.size(); ++k)
    y = dynamic_cast<const OnnxModule&>(*layers[k]).to_onnx(g, y, "layers." + std::to_string(k));
  y = dynamic_cast<const OnnxModule&>(*conv_sep_).to_onnx(g, y, "conv_sep");
  return dynamic_cast<const OnnxModule&>(*features_).to_onnx(g, y, "features");
}

Activations Mbf::forward_block(int64_t block, Activations in) {
  const auto [layer, member] = units_.at(block);
  if (layer < 0) {
    in.x =
        features_->as<GroupImpl>()->layers()->forward(conv_sep_->as<ConvUnitImpl>()->forward(in.x));
  } else if (member >= 0) {
    in.x = layers_[layer]->as<GroupImpl>()->layers()[member]->as<DepthWiseImpl>()->forward(in.x);
  } else if (auto* unit = layers_[layer]->as<ConvUnitImpl>()) {
    in.x = unit->forward(in.x);
  } else {
    in.x = layers_[layer]->as<DepthWiseImpl>()->forward(in.x);
  }
  return in;
}

}  // namespace myriad
