#include "myriad/model/roofline.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>

#include "myriad/model/backbone.h"
#include "myriad/model/batch_norm.h"

namespace myriad {
namespace {

std::map<LayerKind, std::vector<LayerCost>> by_kind(const std::vector<LayerCost>& census) {
  std::map<LayerKind, std::vector<LayerCost>> kinds;
  for (const LayerCost& layer : census) kinds[layer.kind].push_back(layer);
  return kinds;
}

// A graph small enough to count by hand: convolution, batch norm, PReLU, a residual add, a view,
// a matrix product and a cast.
TEST(Roofline, CensusOfAGraphCountedByHand) {
  const auto grad = torch::requires_grad();
  const torch::Tensor x = torch::randn({2, 4, 8, 8}, grad);
  const torch::Tensor w = torch::randn({6, 4, 3, 3}, grad);
  const torch::Tensor gamma = torch::ones({6}, grad), beta = torch::zeros({6}, grad);
  const torch::Tensor slope = torch::full({1}, 0.25, grad);
  const torch::Tensor m = torch::randn({384, 10}, grad);
  const torch::Tensor c = torch::conv2d(x, w, {}, 1, 1);
  const torch::Tensor b = torch::prelu(
      torch::batch_norm(c, gamma, beta, {}, {}, /*training=*/true, 0.1, 1e-5, false), slope);
  const torch::Tensor out = (b + c).flatten(1).mm(m).to(torch::kFloat64);

  const auto kinds = by_kind(layer_census(out));
  ASSERT_EQ(kinds.at(LayerKind::kConvolution).size(), 1u);
  ASSERT_EQ(kinds.at(LayerKind::kBatchNormPrelu).size(), 2u);
  ASSERT_EQ(kinds.at(LayerKind::kAdd).size(), 1u);
  ASSERT_EQ(kinds.at(LayerKind::kGemm).size(), 1u);
  ASSERT_EQ(kinds.at(LayerKind::kCast).size(), 1u);
  EXPECT_EQ(kinds.count(LayerKind::kOther), 0u) << "the flatten is a view";

  // Convolution: 768 outputs, each a dot product of 4 x 3 x 3; x (512), w (216) and the output
  // (768) pass three times, as float32.
  const LayerCost& conv = kinds.at(LayerKind::kConvolution)[0];
  EXPECT_DOUBLE_EQ(conv.flops, 6.0 * 768 * 36);
  EXPECT_DOUBLE_EQ(conv.bytes, 3.0 * 4 * (512 + 216 + 768));
  // Batch norm: its output twice, x three times, gamma and beta once. PReLU: the same with its
  // slope.
  std::vector<double> norm_bytes;
  for (const LayerCost& l : kinds.at(LayerKind::kBatchNormPrelu)) {
    EXPECT_EQ(l.flops, 0.0) << l.op;
    norm_bytes.push_back(l.bytes);
  }
  std::sort(norm_bytes.begin(), norm_bytes.end());
  EXPECT_DOUBLE_EQ(norm_bytes[0], 4 * (2.0 * 768 + 3.0 * 768 + 1));
  EXPECT_DOUBLE_EQ(norm_bytes[1], 4 * (2.0 * 768 + 3.0 * 768 + 6 + 6));
  // The add: two inputs and the output, twice.
  EXPECT_DOUBLE_EQ(kinds.at(LayerKind::kAdd)[0].bytes, 2.0 * 4 * 3 * 768);
  // [2, 384] x [384, 10].
  const LayerCost& mm = kinds.at(LayerKind::kGemm)[0];
  EXPECT_DOUBLE_EQ(mm.flops, 6.0 * 20 * 384);
  EXPECT_DOUBLE_EQ(mm.bytes, 3.0 * 4 * (768 + 3840 + 20));
  // 20 float32 in, 20 float64 out, twice.
  EXPECT_DOUBLE_EQ(kinds.at(LayerKind::kCast)[0].bytes, 2.0 * (20 * 4 + 20 * 8));
}

// forward_fork's second output is a view of the input: its gradient is read once, in the pass
// that writes the input's, and nothing of it moves forward.
TEST(Roofline, ASecondUseOfABatchNormsInputCountsItsGradientOnce) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU: batch norm's own kernels run there";
  BatchNorm bn(64);
  bn->to(torch::kCUDA);
  const torch::Tensor x = torch::randn({8, 64, 7, 5}, torch::kCUDA)
                              .contiguous(torch::MemoryFormat::ChannelsLast)
                              .requires_grad_(true);
  const auto [y, second_use] = bn->forward_fork(x);
  const auto kinds = by_kind(layer_census(y + second_use));
  ASSERT_EQ(kinds.at(LayerKind::kBatchNormPrelu).size(), 1u);
  const LayerCost& norm = kinds.at(LayerKind::kBatchNormPrelu)[0];
  EXPECT_NE(norm.op.find("BatchNormPReLU"), std::string::npos) << norm.op;
  // Float32: the output twice, the second use's gradient once, x three times, gamma and beta once.
  const double n = 8 * 64 * 7 * 5;
  EXPECT_DOUBLE_EQ(norm.bytes, 4 * (2.0 * n + 1.0 * n + 3.0 * n + 64 + 64));
}

TEST(Roofline, InputsWithoutGradientsAreNotCounted) {
  const torch::Tensor x = torch::randn({2, 4, 8, 8});
  const torch::Tensor w = torch::randn({6, 4, 3, 3}, torch::requires_grad());
  const auto census = layer_census(torch::conv2d(x, w, {}, 1, 1));
  ASSERT_EQ(census.size(), 1u);
  EXPECT_DOUBLE_EQ(census[0].flops, 6.0 * 768 * 36) << "the weight and output give the FLOPs";
  EXPECT_DOUBLE_EQ(census[0].bytes, 3.0 * 4 * (216 + 768));
  EXPECT_TRUE(layer_census(x * 2).empty()) << "no graph, no census";
}

// Each layer's floor is the larger of its two times; a kind sums its layers' floors, which is
// more than the larger of the kind's summed times when the layers are bound differently.
TEST(Roofline, FloorsSumEachLayersLargerTime) {
  const std::vector<LayerCost> census = {
      {"a", LayerKind::kConvolution, 4e12, 1e9},  // 4 s of compute, 1 s of memory
      {"b", LayerKind::kConvolution, 1e12, 3e9},  // 1 s of compute, 3 s of memory
      {"c", LayerKind::kAdd, 0, 2e9},             // 2 s of memory
  };
  const std::vector<KindFloor> rows = roofline(census, Ceilings{1.0, 1e9});
  ASSERT_EQ(rows.size(), layer_kinds().size());
  const KindFloor& conv = rows[0];
  EXPECT_EQ(conv.kind, LayerKind::kConvolution);
  EXPECT_EQ(conv.layers, 2);
  EXPECT_DOUBLE_EQ(conv.compute_seconds, 5.0);
  EXPECT_DOUBLE_EQ(conv.memory_seconds, 4.0);
  EXPECT_DOUBLE_EQ(conv.floor_seconds, 7.0);
  EXPECT_EQ(rows[2].kind, LayerKind::kAdd);
  EXPECT_DOUBLE_EQ(rows[2].floor_seconds, 2.0);
  EXPECT_EQ(rows[3].layers, 0);
  EXPECT_DOUBLE_EQ(floor_seconds(rows), 9.0);
}

// The census's matrix products against what the constructors count (Backbone::multiply_adds,
// which the doctor's step model uses), and the layers against the architecture.
TEST(Roofline, BackbonesMultiplyAddsMatchTheirConstructors) {
  struct Case {
    const char* name;
    InputShape input;
  };
  for (const Case& c : {Case{"iresnet18", {3, 112, 112}}, Case{"mbf", {3, 112, 112}},
                        Case{"mobilefacenet", {3, 112, 112}}, Case{"smallcnn", {1, 28, 28}}}) {
    BackboneOptions o;
    o.name = c.name;
    o.input = c.input;
    o.embedding_size = 128;
    const auto net = make_backbone(o);
    net->train();
    const int64_t batch = 2;
    const auto census = layer_census(
        net->forward(torch::randn({batch, c.input.channels, c.input.height, c.input.width})));
    double flops = 0;
    for (const LayerCost& l : census) {
      if (l.kind == LayerKind::kConvolution || l.kind == LayerKind::kGemm) flops += l.flops;
    }
    EXPECT_NEAR(flops / (6.0 * batch), static_cast<double>(net->multiply_adds()),
                1e-9 * net->multiply_adds())
        << c.name;
    if (std::string(c.name) == "iresnet18") {
      const auto kinds = by_kind(census);
      // The stem, 8 blocks of 2, and a downsampling shortcut per stage (each strides by 2); the
      // embedding's linear layer.
      EXPECT_EQ(kinds.at(LayerKind::kConvolution).size(), 21u);
      EXPECT_EQ(kinds.at(LayerKind::kGemm).size(), 1u);
      EXPECT_EQ(kinds.at(LayerKind::kAdd).size(), 8u);
    }
  }
}

}  // namespace
}  // namespace myriad
