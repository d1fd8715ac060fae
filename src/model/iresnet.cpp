#include "myriad/model/iresnet.h"

#include <string>

#include "myriad/model/batch_norm.h"
#include "myriad/model/onnx_graph.h"
#include "myriad/util/error.h"

namespace myriad {

namespace {

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

BatchNorm batch_norm(int64_t channels) {
  return BatchNorm(channels, 1e-5);
}

torch::nn::PReLU prelu(int64_t channels) {
  return torch::nn::PReLU(torch::nn::PReLUOptions().num_parameters(channels));
}

class BasicBlockImpl : public torch::nn::Module, public OnnxModule {
 public:
  // `positions`: pixels of the input, for the count of multiply-adds.
  BasicBlockImpl(int64_t in, int64_t planes, int64_t stride, int64_t positions) {
    bn1_ = register_module("bn1", batch_norm(in));
    conv1_ = register_module("conv1", conv(in, planes, 3, 1));
    bn2_ = register_module("bn2", batch_norm(planes));
    prelu_ = register_module("prelu", prelu(planes));
    conv2_ = register_module("conv2", conv(planes, planes, 3, stride));
    bn3_ = register_module("bn3", batch_norm(planes));
    const int64_t out = positions / (stride * stride);
    multiply_adds_ = positions * conv1_->weight.numel() + out * conv2_->weight.numel();
    if (stride != 1 || in != planes) {
      torch::nn::Conv2d projection = conv(in, planes, 1, stride);
      downsample_ =
          register_module("downsample", torch::nn::Sequential(projection, batch_norm(planes)));
      multiply_adds_ += out * projection->weight.numel();
    }
  }

  int64_t multiply_adds() const { return multiply_adds_; }

  // The weights of the convolutions that forward runs, all through convolve.
  std::vector<torch::Tensor> convolution_weights() const {
    std::vector<torch::Tensor> weights{conv1_->weight, conv2_->weight};
    if (downsample_) weights.push_back(downsample_->ptr(0)->as<torch::nn::Conv2dImpl>()->weight);
    return weights;
  }

  // The block's output, with its sums for the batch norm that reads it next where `sum_output`.
  SummedMap forward(const SummedMap& x, bool sum_output) {
    // x feeds bn1 and the shortcut: bn1's backward adds the shortcut's gradient. Each convolution
    // hands its batch norm the output's sums where it formed them.
    const auto [normalised, shortcut] = bn1_->forward_fork(x);
    const torch::Tensor hidden =
        bn2_->forward_prelu(bn2_->convolve(*conv1_, normalised), prelu_->weight).y;
    const SummedMap out = bn3_->convolve(*conv2_, hidden);
    return bn3_->forward_add(out, downsample_ ? project(shortcut) : shortcut, sum_output);
  }

  std::string to_onnx(OnnxGraph& g, const std::string& x, const std::string& name) const override {
    namespace layers = onnx_layers;
    std::string y = layers::batch_norm(g, x, *bn1_, name + ".bn1", /*spatial=*/true);
    y = layers::conv(g, y, *conv1_, name + ".conv1", bn2_.get());
    y = layers::prelu(g, y, prelu_->weight, name + ".prelu");
    y = layers::conv(g, y, *conv2_, name + ".conv2", bn3_.get());
    const std::string shortcut =
        downsample_ ? layers::sequential(g, x, *downsample_, name + ".downsample") : x;
    return g.node("Add", name + ".add", {y, shortcut});
  }

 private:
  // The shortcut's projection: downsample's convolution and batch norm (registered as a
  // Sequential, as insightface names their weights).
  torch::Tensor project(const torch::Tensor& shortcut) {
    auto& bn = *downsample_->ptr(1)->as<BatchNormImpl>();
    return bn.forward_output(
        bn.convolve(*downsample_->ptr(0)->as<torch::nn::Conv2dImpl>(), shortcut));
  }

  BatchNorm bn1_{nullptr}, bn2_{nullptr}, bn3_{nullptr};
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::PReLU prelu_{nullptr};
  torch::nn::Sequential downsample_{nullptr};
  int64_t multiply_adds_ = 0;
};
TORCH_MODULE(BasicBlock);

// The index-th basic block, counting through the stages.
BasicBlockImpl& residual_block(const torch::nn::Sequential (&layers)[4], int64_t index) {
  int64_t unit = index;
  for (const torch::nn::Sequential& layer : layers) {
    if (unit < static_cast<int64_t>(layer->size())) return *layer->ptr(unit)->as<BasicBlockImpl>();
    unit -= static_cast<int64_t>(layer->size());
  }
  MYRIAD_THROW("an IResNet has no residual block {}", index);
}

}  // namespace

IResNet::IResNet(const BackboneOptions& options, const std::vector<int64_t>& blocks) {
  const InputShape& in = options.input;
  if (in.height % 16 != 0 || in.width % 16 != 0) {
    throw UsageError(str_format("{} needs an input height and width divisible by 16, got {}x{}",
                                options.name, in.height, in.width));
  }
  conv1_ = register_module("conv1", conv(in.channels, 64, 3, 1));
  bn1_ = register_module("bn1", batch_norm(64));
  prelu_ = register_module("prelu", prelu(64));
  add_block("stem", {"conv1", "bn1", "prelu"});
  int64_t positions = in.height * in.width;
  add_multiply_adds(positions * conv1_->weight.numel());
  const int64_t widths[4] = {64, 128, 256, 512};
  int64_t channels = 64;
  for (int stage = 0; stage < 4; ++stage) {
    const std::string layer = "layer" + std::to_string(stage + 1);
    layers_[stage] = register_module(layer, torch::nn::Sequential());
    for (int64_t b = 0; b < blocks[stage]; ++b) {
      const int64_t stride = b == 0 ? 2 : 1;
      BasicBlock block(channels, widths[stage], stride, positions);
      add_multiply_adds(block->multiply_adds());
      positions /= stride * stride;
      layers_[stage]->push_back(block);
      add_block(layer + "." + std::to_string(b), {layer + "." + std::to_string(b)});
      channels = widths[stage];
    }
  }
  bn2_ = register_module("bn2", batch_norm(512));
  dropout_ = register_module("dropout", torch::nn::Dropout(options.dropout));
  fc_ = register_module(
      "fc", torch::nn::Linear(512 * (in.height / 16) * (in.width / 16), options.embedding_size));
  add_multiply_adds(fc_->weight.numel());
  features_ = register_module("features", BatchNorm(options.embedding_size, 1e-5));
  add_block("head", {"bn2", "fc", "features"});
  torch::NoGradGuard no_grad;
  for (auto& module : modules(false)) {
    if (auto* c = module->as<torch::nn::Conv2d>()) c->weight.normal_(0.0, 0.1);
  }
  features_->weight.fill_(1.0);
  features_->weight.set_requires_grad(false);
}

// Where asked (in.sum_output), each block's last batch norm forms its output's sums for the batch
// norm that reads it next (the next block's bn1, or the head's bn2), which then makes no
// statistics pass over it.
Activations IResNet::forward_block(int64_t block, Activations in) {
  if (block + 1 == num_blocks()) {
    in.x = features_(fc_(dropout_(bn2_->forward_output(summed_input(in)).flatten(1))));
    in.summed = {};
    return in;
  }
  in.summed =
      block == 0 ? bn1_->forward_prelu(bn1_->convolve(*conv1_, in.x), prelu_->weight, in.sum_output)
                 : residual_block(layers_, block - 1).forward(summed_input(in), in.sum_output);
  in.x = in.summed.y;
  return in;
}

std::vector<torch::Tensor> IResNet::convolution_weights(int64_t block) const {
  if (block == 0) return {conv1_->weight};
  if (block + 1 == num_blocks()) return {};
  return residual_block(layers_, block - 1).convolution_weights();
}

std::string IResNet::to_onnx(OnnxGraph& g, const std::string& x) const {
  namespace layers = onnx_layers;
  std::string y =
      layers::prelu(g, layers::conv(g, x, *conv1_, "conv1", bn1_.get()), prelu_->weight, "prelu");
  for (int stage = 0; stage < 4; ++stage) {
    const auto blocks = layers_[stage]->children();
    for (size_t b = 0; b < blocks.size(); ++b) {
      y = dynamic_cast<const OnnxModule&>(*blocks[b])
              .to_onnx(g, y, "layer" + std::to_string(stage + 1) + "." + std::to_string(b));
    }
  }
  y = layers::batch_norm(g, y, *bn2_, "bn2", /*spatial=*/true);
  y = g.node("Flatten", "flatten", {y}, {{"axis", int64_t{1}}});
  return layers::linear(g, y, *fc_, "fc", features_.get());
}

std::string IResNet::legacy_name(const std::string& name) const {
  static const std::pair<const char*, const char*> kStem[] = {
      {"conv1.", "stem.0."}, {"bn1.", "stem.1."}, {"prelu.", "stem.2."}, {"bn2.", "bn."}};
  for (const auto& [now, before] : kStem) {
    if (name.rfind(now, 0) == 0) return before + name.substr(std::string(now).size());
  }
  // layerK.J.rest -> stages.N.rest, N counting the blocks of the stages before K.
  if (name.rfind("layer", 0) != 0) return "";
  const size_t dot = name.find('.');
  const size_t second = name.find('.', dot + 1);
  if (dot == std::string::npos || second == std::string::npos) return "";
  const int stage = std::stoi(name.substr(5, dot - 5)) - 1;
  int64_t index = std::stoll(name.substr(dot + 1, second - dot - 1));
  for (int k = 0; k < stage; ++k) index += static_cast<int64_t>(layers_[k]->size());
  return "stages." + std::to_string(index) + name.substr(second);
}

}  // namespace myriad
