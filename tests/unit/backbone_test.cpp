#include <gtest/gtest.h>
#include <torch/torch.h>

#include "myriad/model/backbone.h"
#include "myriad/util/error.h"

namespace myriad {
namespace {

int64_t parameter_count(torch::nn::Module& m) {
  int64_t n = 0;
  for (const torch::Tensor& p : m.parameters()) n += p.numel();
  return n;
}

std::shared_ptr<Backbone> build(const std::string& name, InputShape input,
                                int64_t embedding = 512) {
  BackboneOptions o;
  o.name = name;
  o.input = input;
  o.embedding_size = embedding;
  return make_backbone(o);
}

TEST(Backbone, EmbeddingShapesAtSmallInputs) {
  torch::manual_seed(0);
  for (const std::string name : {"iresnet18", "iresnet34", "mobilefacenet"}) {
    auto net = build(name, {3, 32, 32}, 64);
    net->eval();
    torch::NoGradGuard no_grad;
    EXPECT_EQ(net->forward(torch::randn({2, 3, 32, 32})).sizes(), (std::vector<int64_t>{2, 64}))
        << name;
  }
  auto small = build("smallcnn", {1, 28, 28}, 128);
  EXPECT_EQ(small->forward(torch::randn({3, 1, 28, 28})).sizes(), (std::vector<int64_t>{3, 128}));
  auto wide = build("smallcnn", {3, 12, 20}, 16);
  EXPECT_EQ(wide->forward(torch::randn({2, 3, 12, 20})).sizes(), (std::vector<int64_t>{2, 16}));
}

// The same architectures as insightface's arcface_torch, parameter for parameter (its r50 and
// r100 report 43.59M and 65.15M parameters at 112x112 with a 512-d embedding).
TEST(Backbone, IResNetSizesMatchTheReference) {
  EXPECT_NEAR(parameter_count(*build("iresnet50", {3, 112, 112})) / 1e6, 43.59, 0.01);
  EXPECT_NEAR(parameter_count(*build("iresnet100", {3, 112, 112})) / 1e6, 65.15, 0.01);
}

TEST(Backbone, BadNamesAndShapesAreUsageErrors) {
  EXPECT_THROW(build("resnet9000", {3, 112, 112}), UsageError);
  EXPECT_THROW(build("iresnet50", {3, 100, 100}), UsageError);
  EXPECT_THROW(build("smallcnn", {1, 30, 30}), UsageError);
  EXPECT_THROW(parse_input_shape("3x112"), UsageError);
  EXPECT_THROW(parse_input_shape("3x112x112x1"), UsageError);
  EXPECT_THROW(parse_input_shape("0x2x2"), UsageError);
  EXPECT_EQ(parse_input_shape("1x28x28").height, 28);
}

}  // namespace
}  // namespace myriad
