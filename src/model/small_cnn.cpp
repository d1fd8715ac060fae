#include "myriad/model/small_cnn.h"

#include <utility>

#include "myriad/model/batch_norm.h"
#include "myriad/model/onnx_graph.h"
#include "myriad/util/error.h"

namespace myriad {

namespace {

// The blocks of `features`: [first, last) of its modules each.
struct ConvBlock {
  const char* name;
  int64_t first, last;
};
constexpr ConvBlock kConvBlocks[] = {{"conv1", 0, 4}, {"conv2", 4, 8}, {"conv3", 8, 11}};

void add_conv_bn_relu(torch::nn::Sequential& layers, int64_t in, int64_t out) {
  layers->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).padding(1).bias(false)));
  layers->push_back(BatchNorm(out));
  layers->push_back(torch::nn::ReLU(torch::nn::ReLUOptions(true)));
}

}  // namespace

SmallCnn::SmallCnn(const BackboneOptions& options) {
  const InputShape& in = options.input;
  if (in.height % 4 != 0 || in.width % 4 != 0) {
    throw UsageError(str_format(
        "smallcnn needs an input height and width divisible by 4, got {}x{}", in.height, in.width));
  }
  features_ = register_module("features", torch::nn::Sequential());
  add_conv_bn_relu(features_, in.channels, 32);
  features_->push_back(torch::nn::MaxPool2d(2));
  add_conv_bn_relu(features_, 32, 64);
  features_->push_back(torch::nn::MaxPool2d(2));
  add_conv_bn_relu(features_, 64, 128);
  // The three convolutions run at full, half and quarter resolution.
  const int64_t positions = in.height * in.width;
  const std::pair<int, int64_t> convs[] = {{0, 1}, {4, 4}, {8, 16}};  // layer, positions divisor
  for (const auto& [index, scale] : convs) {
    add_multiply_adds(positions / scale *
                      features_[index]->as<torch::nn::Conv2d>()->weight.numel());
  }
  dropout_ = register_module("dropout", torch::nn::Dropout(options.dropout));
  fc_ = register_module(
      "fc", torch::nn::Linear(128 * (in.height / 4) * (in.width / 4), options.embedding_size));
  add_multiply_adds(fc_->weight.numel());
  embedding_ = register_module("embedding", BatchNorm(options.embedding_size));
  for (const auto& [name, first, last] : kConvBlocks) {
    std::vector<std::string> prefixes;
    for (int64_t k = first; k < last; ++k) prefixes.push_back("features." + std::to_string(k));
    add_block(name, prefixes);
  }
  add_block("head", {"fc", "embedding"});
  torch::NoGradGuard no_grad;
  for (auto& module : modules(false)) {
    if (auto* c = module->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    }
  }
}

std::string SmallCnn::to_onnx(OnnxGraph& g, const std::string& x) const {
  std::string y = onnx_layers::sequential(g, x, *features_, "features");
  y = g.node("Flatten", "flatten", {y}, {{"axis", int64_t{1}}});
  return onnx_layers::linear(g, y, *fc_, "fc", embedding_.get());
}

Activations SmallCnn::forward_block(int64_t block, Activations in) {
  if (block + 1 == num_blocks()) {
    in.x = embedding_(fc_(dropout_(in.x.flatten(1))));
    return in;
  }
  const ConvBlock& b = kConvBlocks[block];
  for (auto module = features_->begin() + b.first; module != features_->begin() + b.last; ++module)
    in.x = module->forward(in.x);
  return in;
}

}  // namespace myriad
