#include "myriad/model/iresnet.h"

#include "myriad/model/batch_norm.h"
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

class BasicBlockImpl : public torch::nn::Module {
 public:
  // `positions`: pixels of the input, for the count of multiply-adds.
  BasicBlockImpl(int64_t in, int64_t planes, int64_t stride, int64_t positions) {
    bn1_ = register_module("bn1", batch_norm(in));
    conv1_ = register_module("conv1", conv(in, planes, 3, 1));
    bn2_ = register_module("bn2", batch_norm(planes));
    prelu_ = register_module("prelu",
                             torch::nn::PReLU(torch::nn::PReLUOptions().num_parameters(planes)));
    conv2_ = register_module("conv2", conv(planes, planes, 3, stride));
    bn3_ = register_module("bn3", batch_norm(planes));
    const int64_t out = positions / (stride * stride);
    multiply_adds_ = positions * conv1_->weight.numel() + out * conv2_->weight.numel();
    if (stride != 1 || in != planes) {
      torch::nn::Conv2d projection = conv(in, planes, 1, stride);
      shortcut_ =
          register_module("downsample", torch::nn::Sequential(projection, batch_norm(planes)));
      multiply_adds_ += out * projection->weight.numel();
    }
  }

  int64_t multiply_adds() const { return multiply_adds_; }

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor out = bn3_(conv2_(prelu_(bn2_(conv1_(bn1_(x))))));
    return out + (shortcut_ ? shortcut_->forward(x) : x);
  }

 private:
  BatchNorm bn1_{nullptr}, bn2_{nullptr}, bn3_{nullptr};
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  torch::nn::PReLU prelu_{nullptr};
  torch::nn::Sequential shortcut_{nullptr};
  int64_t multiply_adds_ = 0;
};
TORCH_MODULE(BasicBlock);

}  // namespace

IResNet::IResNet(const BackboneOptions& options, const std::vector<int64_t>& blocks) {
  const InputShape& in = options.input;
  if (in.height % 16 != 0 || in.width % 16 != 0) {
    throw UsageError(str_format("{} needs an input height and width divisible by 16, got {}x{}",
                                options.name, in.height, in.width));
  }
  stem_ = register_module(
      "stem",
      torch::nn::Sequential(conv(in.channels, 64, 3, 1), batch_norm(64),
                            torch::nn::PReLU(torch::nn::PReLUOptions().num_parameters(64))));
  stages_ = register_module("stages", torch::nn::Sequential());
  int64_t positions = in.height * in.width;
  add_multiply_adds(positions * stem_[0]->as<torch::nn::Conv2d>()->weight.numel());
  const int64_t widths[4] = {64, 128, 256, 512};
  int64_t channels = 64;
  for (int stage = 0; stage < 4; ++stage) {
    for (int64_t b = 0; b < blocks[stage]; ++b) {
      const int64_t stride = b == 0 ? 2 : 1;
      BasicBlock block(channels, widths[stage], stride, positions);
      add_multiply_adds(block->multiply_adds());
      positions /= stride * stride;
      stages_->push_back(block);
      channels = widths[stage];
    }
  }
  bn_ = register_module("bn", batch_norm(512));
  dropout_ = register_module("dropout", torch::nn::Dropout(options.dropout));
  fc_ = register_module(
      "fc", torch::nn::Linear(512 * (in.height / 16) * (in.width / 16), options.embedding_size));
  add_multiply_adds(fc_->weight.numel());
  features_ = register_module("features", BatchNorm(options.embedding_size, 1e-5));
  torch::NoGradGuard no_grad;
  for (auto& module : modules(false)) {
    if (auto* c = module->as<torch::nn::Conv2d>()) c->weight.normal_(0.0, 0.1);
  }
  features_->weight.fill_(1.0);
  features_->weight.set_requires_grad(false);
}

torch::Tensor IResNet::forward(const torch::Tensor& images) {
  torch::Tensor x = bn_(stages_->forward(stem_->forward(images)));
  return features_(fc_(dropout_(x.flatten(1))));
}

}  // namespace myriad
