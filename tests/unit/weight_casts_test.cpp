#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "myriad/model/backbone.h"
#include "myriad/model/weight_casts.h"
#include "myriad/util/autocast.h"

namespace myriad {
namespace {

const void* storage_of(const torch::Tensor& t) {
  return t.storage().data_ptr().get();
}

std::vector<torch::Device> devices() {
  std::vector<torch::Device> all{torch::kCPU};
  if (torch::cuda::is_available()) all.emplace_back(torch::kCUDA);
  return all;
}

// Each copy is the weight's own cast, in its layout; each gradient is what the cast's own backward
// gives, in the weight's layout, and the group's gradients come from one cast back (one storage).
// Weights that cannot join keep no copy.
TEST(WeightCasts, CopiesAndGradientsAreThoseOfEachWeightsOwnCast) {
  for (const torch::Device& device : devices()) {
    for (const torch::ScalarType dtype : {torch::kBFloat16, torch::kHalf}) {
      SCOPED_TRACE(device.str() + " " + std::string(c10::toString(dtype)));
      torch::manual_seed(1);
      const auto leaf = [&](torch::Tensor t) { return t.to(device).requires_grad_(true); };
      std::vector<torch::Tensor> joined{
          leaf(torch::randn({64, 8, 3, 3})),
          leaf(torch::randn({64, 8, 3, 3}).contiguous(torch::MemoryFormat::ChannelsLast)),
          leaf(torch::randn({32, 16, 1, 1}).contiguous(torch::MemoryFormat::ChannelsLast)),
          leaf(torch::randn({128}))};
      std::vector<torch::Tensor> apart{
          leaf(torch::randn({3, 5})),                          // 15 elements: misaligns
          leaf(torch::randn({64, 2}).to(torch::kDouble)),      // not float32
          leaf(torch::randn({8, 64, 3, 3}).transpose(1, 2))};  // dense in neither layout
      std::vector<torch::Tensor> all = joined;
      all.insert(all.end(), apart.begin(), apart.end());
      std::vector<torch::Tensor> references, factors;
      for (const torch::Tensor& w : joined) {
        references.push_back(w.detach().clone(at::MemoryFormat::Preserve).requires_grad_(true));
        factors.push_back(torch::randn(w.sizes()).to(device));
      }
      torch::Tensor loss = torch::zeros({}, torch::TensorOptions(device));
      {
        WeightCasts casts(dtype);
        casts.cast(all);
        EXPECT_EQ(casts.size(), joined.size());
        for (const torch::Tensor& w : apart) {
          EXPECT_FALSE(WeightCasts::copy_of(w, dtype).defined());
        }
        const torch::ScalarType other = dtype == torch::kHalf ? torch::kBFloat16 : torch::kHalf;
        EXPECT_FALSE(WeightCasts::copy_of(joined[0], other).defined());
        for (size_t i = 0; i < joined.size(); ++i) {
          const torch::Tensor copy = WeightCasts::copy_of(joined[i], dtype);
          ASSERT_TRUE(copy.defined()) << i;
          const torch::Tensor own = references[i].to(dtype);
          EXPECT_EQ(copy.scalar_type(), dtype);
          EXPECT_EQ(copy.strides(), joined[i].strides()) << i;
          EXPECT_TRUE(torch::equal(copy, own)) << i;
          loss = loss + (copy.to(torch::kFloat32) * factors[i]).sum();
          (own.to(torch::kFloat32) * factors[i]).sum().backward();
        }
      }
      EXPECT_FALSE(WeightCasts::copy_of(joined[0], dtype).defined()) << "after its scope";
      loss.backward();
      for (size_t i = 0; i < joined.size(); ++i) {
        EXPECT_TRUE(torch::equal(joined[i].grad(), references[i].grad())) << i;
        EXPECT_EQ(joined[i].grad().strides(), joined[i].strides()) << i;
        EXPECT_EQ(storage_of(joined[i].grad()), storage_of(joined[0].grad())) << i;
      }
    }
  }
}

TEST(WeightCasts, InnerScopesHideNothingOfOuterOnes) {
  const torch::Tensor a = torch::randn({64}).requires_grad_(true);
  const torch::Tensor b = torch::randn({64}).requires_grad_(true);
  WeightCasts outer(torch::kBFloat16);
  outer.cast({a});
  {
    WeightCasts inner(torch::kBFloat16);
    inner.cast({b});
    EXPECT_TRUE(WeightCasts::copy_of(a, torch::kBFloat16).defined());
    EXPECT_TRUE(WeightCasts::copy_of(b, torch::kBFloat16).defined());
  }
  EXPECT_TRUE(WeightCasts::copy_of(a, torch::kBFloat16).defined());
  EXPECT_FALSE(WeightCasts::copy_of(b, torch::kBFloat16).defined());
  EXPECT_THROW(WeightCasts(torch::kFloat32), std::exception);
}

struct Pass {
  torch::Tensor embedding;
  std::vector<torch::Tensor> gradients;
  std::vector<const void*> convolution_storages;
};

// One training pass of r18 under autocast in `dtype`, its weights cast in groups or by autocast.
Pass training_pass(const torch::Device& device, torch::ScalarType dtype, bool grouped,
                   bool checkpointing) {
  torch::manual_seed(8);
  BackboneOptions o;
  o.name = "r18";
  o.input = {3, 32, 32};
  o.embedding_size = 16;
  auto net = make_backbone(o);
  net->to(device);
  net->set_channels_last(device.is_cuda());
  net->set_activation_checkpointing(checkpointing);
  net->set_grouped_weight_casts(grouped);
  torch::manual_seed(3);
  const torch::Tensor images = torch::randn({4, 3, 32, 32}).to(device);
  const torch::Tensor projection = torch::randn({4, 16}).to(device);
  Pass pass;
  {
    const AutocastGuard autocast(device, dtype);
    pass.embedding = net->forward(net->in_layout(images)).to(torch::kFloat32);
  }
  (pass.embedding * projection).sum().backward();
  pass.embedding = pass.embedding.detach();
  for (const torch::Tensor& p : net->parameters()) {
    if (p.grad().defined()) pass.gradients.push_back(p.grad());
  }
  for (int64_t b = 0; b < net->num_blocks(); ++b) {
    for (const torch::Tensor& w : net->convolution_weights(b)) {
      pass.convolution_storages.push_back(storage_of(w.grad()));
    }
  }
  return pass;
}

// Each gradient of `a` against the scale of `b`'s together (some, as the FC's bias before batch
// norm, are float noise): none further than `tolerance`, or, at 0, each equal bit for bit.
void expect_gradients_near(const Pass& a, const Pass& b, double tolerance) {
  ASSERT_EQ(a.gradients.size(), b.gradients.size());
  ASSERT_FALSE(b.gradients.empty());
  std::vector<torch::Tensor> flat;
  for (const torch::Tensor& g : b.gradients) flat.push_back(g.reshape(-1));
  const double scale = torch::cat(flat).norm().item<double>();
  for (size_t k = 0; k < a.gradients.size(); ++k) {
    if (tolerance == 0) {
      EXPECT_TRUE(torch::equal(a.gradients[k], b.gradients[k])) << k;
    } else {
      EXPECT_LE((a.gradients[k] - b.gradients[k]).norm().item<double>(), tolerance * scale) << k;
    }
  }
}

// An IResNet's training pass computes the same with its weights cast in groups as with autocast's
// casts, and the convolutions took the group's copies: their gradients share the group's storage.
// On the CPU bit for bit; on a GPU cuDNN may choose other kernels for other weight addresses.
TEST(WeightCasts, IResNetTrainsAsUnderAutocastsOwnCasts) {
  std::vector<std::pair<torch::Device, torch::ScalarType>> cases{{torch::kCPU, torch::kBFloat16}};
  if (torch::cuda::is_available()) {
    cases.emplace_back(torch::kCUDA, torch::kBFloat16);
    cases.emplace_back(torch::kCUDA, torch::kHalf);
  }
  for (const auto& [device, dtype] : cases) {
    SCOPED_TRACE(device.str() + " " + std::string(c10::toString(dtype)));
    const Pass own = training_pass(device, dtype, false, false);
    const Pass grouped = training_pass(device, dtype, true, false);
    const double tolerance = device.is_cuda() ? 1e-2 : 0.0;
    EXPECT_LE((grouped.embedding - own.embedding).norm().item<double>(),
              tolerance * own.embedding.norm().item<double>());
    expect_gradients_near(grouped, own, tolerance);
    for (const void* storage : grouped.convolution_storages) {
      EXPECT_EQ(storage, grouped.convolution_storages.front());
    }
    EXPECT_NE(own.convolution_storages[0], own.convolution_storages[1]);
  }
}

// Recomputed blocks keep autocast's casts and split the group; the start-up line counts the groups.
TEST(WeightCasts, RecomputedBlocksKeepAutocastsCasts) {
  BackboneOptions o;
  o.name = "r18";
  o.input = {3, 32, 32};
  auto net = make_backbone(o);
  EXPECT_EQ(net->weight_casts_note(), "convolution weights cast in 1 group");
  net->set_grouped_weight_casts(false);
  EXPECT_EQ(net->weight_casts_note(), "");
  o.name = "vit_t";
  o.input = {3, 112, 112};
  EXPECT_EQ(make_backbone(o)->weight_casts_note(), "");

  using Groups = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(net->weight_cast_groups(0, 10), Groups({{0, 10}}));  // stem, 8 blocks, head
  EXPECT_EQ(net->weight_cast_groups(2, 5), Groups({{2, 5}}));
  net->set_activation_checkpointing(true);  // blocks 1 ... 8 run again in backward
  EXPECT_EQ(net->weight_cast_groups(0, 10), Groups({{0, 1}, {9, 10}}));
  EXPECT_EQ(net->weight_cast_groups(3, 6), Groups());

  const Pass checkpointed = training_pass(torch::kCPU, torch::kBFloat16, true, true);
  const Pass plain = training_pass(torch::kCPU, torch::kBFloat16, false, false);
  expect_gradients_near(checkpointed, plain, 1e-5);
}

}  // namespace
}  // namespace myriad
