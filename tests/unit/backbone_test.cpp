#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <optional>
#include <string>

#include "myriad/model/backbone.h"
#include "myriad/model/batch_norm.h"
#include "myriad/util/autocast.h"
#include "myriad/util/error.h"
#include "support/exact_float32.h"
#include "support/model_switch.h"

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

// Multiply-adds per 112x112 image as insightface publishes them for its r50 and r100 (12.6 and
// 24.2 GFLOPs at 2 FLOPs per multiply-add), and as Chen et al. (2018) give for MobileFaceNet with a
// 128-d embedding (221M MAdds). smallcnn's three convolutions and linear layer, counted by hand.
TEST(Backbone, MultiplyAddsMatchPublishedCounts) {
  EXPECT_NEAR(build("iresnet50", {3, 112, 112})->multiply_adds() / 1e9, 6.3, 0.05);
  EXPECT_NEAR(build("iresnet100", {3, 112, 112})->multiply_adds() / 1e9, 12.1, 0.05);
  EXPECT_NEAR(build("mobilefacenet", {3, 112, 112}, 128)->multiply_adds() / 1e6, 221, 3);
  const int64_t small =
      28 * 28 * 32 * 9 + 14 * 14 * 64 * 32 * 9 + 7 * 7 * 128 * 64 * 9 + 128 * 7 * 7 * 128;
  EXPECT_EQ(build("smallcnn", {1, 28, 28}, 128)->multiply_adds(), small);
}

// Channels-last is a storage layout only: every backbone computes the same embedding and the
// same gradients in it, on the CPU here as with cuDNN's NHWC kernels on GPUs.
TEST(Backbone, ChannelsLastComputesTheSameFunction) {
  for (const std::string name : {"iresnet18", "mobilefacenet", "smallcnn"}) {
    const InputShape shape = name == "smallcnn" ? InputShape{1, 28, 28} : InputShape{3, 32, 32};
    torch::manual_seed(3);
    auto plain = build(name, shape, 32);
    torch::manual_seed(3);
    auto fast = build(name, shape, 32);
    fast->set_channels_last(true);
    ASSERT_TRUE(fast->channels_last());
    for (const torch::Tensor& p : fast->parameters()) {
      if (p.dim() == 4) {
        EXPECT_TRUE(p.is_contiguous(torch::MemoryFormat::ChannelsLast)) << name;
      }
    }
    const torch::Tensor images = torch::randn({4, shape.channels, shape.height, shape.width});
    EXPECT_TRUE(fast->in_layout(images).is_contiguous(torch::MemoryFormat::ChannelsLast));
    const torch::Tensor projection = torch::randn({4, 32});
    const torch::Tensor a = plain->forward(plain->in_layout(images));
    const torch::Tensor b = fast->forward(fast->in_layout(images));
    EXPECT_LE((a - b).norm().item<double>(), 1e-5 * a.norm().item<double>()) << name;
    (a * projection).sum().backward();
    (b * projection).sum().backward();
    // Against the whole gradient's norm: a bias followed by batch norm has a gradient that is zero
    // up to rounding, whose own relative error means nothing.
    std::vector<torch::Tensor> pa, pb, flat;
    for (const torch::Tensor& p : plain->parameters()) {
      if (p.grad().defined()) pa.push_back(p), flat.push_back(p.grad().reshape(-1));
    }
    for (const torch::Tensor& p : fast->parameters()) {
      if (p.grad().defined()) pb.push_back(p);
    }
    ASSERT_EQ(pa.size(), pb.size());
    const double scale = torch::cat(flat).norm().item<double>();
    for (size_t k = 0; k < pa.size(); ++k) {
      EXPECT_LE((pa[k].grad() - pb[k].grad()).norm().item<double>(), 1e-4 * scale)
          << name << " parameter " << k;
    }
  }
}

double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).norm().item<double>() / b.norm().item<double>();
}

// One training pass of `name` on the GPU: the embedding, and every parameter's gradient as one
// vector. Channels-last maps take myriad's batch norm kernels (with PReLU and the residual adds);
// NCHW maps take LibTorch's batch norm, PReLU and adds.
struct GpuPass {
  torch::Tensor embedding, gradient;
};

GpuPass gpu_pass(const std::string& name, InputShape shape, const torch::Tensor& images,
                 const torch::Tensor& projection, bool fused, torch::ScalarType dtype) {
  const torch::Device gpu(torch::kCUDA);
  torch::manual_seed(6);
  auto net = build(name, shape, projection.size(1));
  net->to(gpu);
  net->set_channels_last(fused);
  EXPECT_EQ(batch_norm_runs_own_kernels(gpu, false, fused), fused);
  torch::Tensor y;
  {
    std::optional<AutocastGuard> autocast;
    if (dtype != torch::kFloat32) autocast.emplace(gpu, dtype);
    y = net->forward(net->in_layout(images)).to(torch::kFloat32);
  }
  (y * projection).sum().backward();
  std::vector<torch::Tensor> flat;
  for (const torch::Tensor& p : net->parameters()) {
    if (p.grad().defined()) flat.push_back(p.grad().reshape(-1).to(torch::kFloat32));
  }
  return {y.detach(), torch::cat(flat)};
}

// The fused batch norm computes the unfused function, forward and backward, for every IResNet
// depth and mbf: in float32 up to rounding (batch norm's backward over 8 images amplifies it), and
// under bfloat16 autocast (also with the statistics from the convolutions) no further from the
// float32 function than LibTorch's path is. bfloat16's rounding compounds over the depth (r200's
// two bf16 paths differ by 16% in their gradients), so each is set against float32, not against
// the other.
TEST(Backbone, FusedBatchNormComputesTheUnfusedFunction) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const myriad::testing::ExactFloat32 exact;
  const std::pair<const char*, InputShape> nets[] = {{"r18", {3, 64, 64}},  {"r34", {3, 64, 64}},
                                                     {"r50", {3, 64, 64}},  {"r100", {3, 64, 64}},
                                                     {"r200", {3, 64, 64}}, {"mbf", {3, 112, 112}}};
  for (const auto& [name, shape] : nets) {
    SCOPED_TRACE(name);
    torch::manual_seed(5);
    const torch::Tensor images =
        torch::randn({8, shape.channels, shape.height, shape.width}).to(torch::kCUDA);
    const torch::Tensor projection = torch::randn({8, 32}).to(torch::kCUDA);
    const auto pass = [&](bool fused, torch::ScalarType dtype) {
      return gpu_pass(name, shape, images, projection, fused, dtype);
    };
    const GpuPass exact32 = pass(false, torch::kFloat32);
    const GpuPass fused32 = pass(true, torch::kFloat32);
    EXPECT_LE(relative_difference(fused32.embedding, exact32.embedding), 1e-2) << "float32";
    EXPECT_LE(relative_difference(fused32.gradient, exact32.gradient), 1e-2) << "float32";
    const GpuPass plain16 = pass(false, torch::kBFloat16);
    const GpuPass fused16 = pass(true, torch::kBFloat16);
    std::printf(
        "%s against float32: fused float32 %.1e / %.1e, bf16 fused %.1e / %.1e, bf16 LibTorch "
        "%.1e / %.1e (embedding / gradients)\n",
        name, relative_difference(fused32.embedding, exact32.embedding),
        relative_difference(fused32.gradient, exact32.gradient),
        relative_difference(fused16.embedding, exact32.embedding),
        relative_difference(fused16.gradient, exact32.gradient),
        relative_difference(plain16.embedding, exact32.embedding),
        relative_difference(plain16.gradient, exact32.gradient));
    const auto expect_near_float32 = [&](const GpuPass& bf16, const char* path) {
      EXPECT_LE(relative_difference(bf16.embedding, exact32.embedding),
                2 * relative_difference(plain16.embedding, exact32.embedding) + 2e-2)
          << path << ": bfloat16 embedding";
      EXPECT_LE(relative_difference(bf16.gradient, exact32.gradient),
                2 * relative_difference(plain16.gradient, exact32.gradient) + 2e-2)
          << path << ": bfloat16 gradients";
    };
    expect_near_float32(fused16, "fused");
    // And with the statistics from cuDNN's convolutions (--conv-statistics), where built.
    if (convolution_statistics_built()) {
      const GpuPass sums16 = [&] {
        const auto on = myriad::testing::convolution_statistics_on();
        return pass(true, torch::kBFloat16);
      }();
      expect_near_float32(sums16, "statistics from the convolutions");
    }
  }
}

// IResNet's blocks form their outputs' sums where asked (forward_blocks asks where the next block
// runs right after), and the next block's first batch norm takes its statistics from them.
TEST(Backbone, IResNetBlocksHandTheirOutputsSumsOn) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const torch::Device gpu(torch::kCUDA);
  torch::manual_seed(7);
  auto net = build("r18", {3, 32, 32}, 16);
  net->to(gpu);
  net->set_channels_last(true);
  net->train();
  Activations in{net->in_layout(torch::randn({4, 3, 32, 32}).to(gpu)), {}, {}};
  EXPECT_FALSE(net->forward_block(0, in).summed.sums.defined()) << "not asked";
  in.sum_output = true;
  Activations stem = net->forward_block(0, in);
  ASSERT_TRUE(stem.summed.sums.defined());
  EXPECT_TRUE(stem.summed.y.is_same(stem.x));
  stem.sum_output = true;
  const Activations first = net->forward_block(1, stem);
  ASSERT_TRUE(first.summed.sums.defined());
  EXPECT_TRUE(first.summed.y.is_same(first.x));
  // Block 2 (layer1.1) reads block 1's output: a shift moved by 1 moves its bn1's mean by 1, and
  // the running mean by the momentum.
  torch::Tensor running_mean = *net->named_buffers().find("layer1.1.bn1.running_mean");
  const torch::Tensor before = running_mean.clone();
  net->forward_block(2, first);
  const torch::Tensor plain = running_mean.clone();
  running_mean.detach().copy_(before);
  Activations moved = first;
  moved.summed.shift = first.summed.shift + 1.0;
  net->forward_block(2, moved);
  EXPECT_NEAR((running_mean - plain).mean().item<double>(), 0.1, 1e-3);
}

// The switch chooses the route a forward takes: on, each block's output and the stem's are summed
// for the batch norm after them (the next block's bn1, the head's bn2), which then makes no
// statistics pass, and whose backward forms the block's last batch norm's backward sums (not the
// stem's, which has a slope); off, every batch norm makes its own. Counted against the network's
// modules.
TEST(Backbone, OutputSumsSwitchChoosesTheRoute) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const torch::Device gpu(torch::kCUDA);
  torch::manual_seed(5);
  auto net = build("r18", {3, 32, 32}, 16);
  net->to(gpu);
  net->set_channels_last(true);
  net->train();
  int64_t batch_norms = 0, blocks = 0;
  for (const auto& item : net->named_modules()) {
    batch_norms += item.value()->as<BatchNorm>() != nullptr;
    const std::string& name = item.key();
    blocks += name.rfind("layer", 0) == 0 && name.size() > 4 &&
              name.compare(name.size() - 4, 4, ".bn1") == 0;
  }
  ASSERT_EQ(blocks, 8) << "iresnet18's 2 + 2 + 2 + 2 blocks";
  const torch::Tensor images = net->in_layout(torch::randn({4, 3, 32, 32}).to(gpu));
  for (const bool on : {true, false}) {
    SCOPED_TRACE(on ? "on" : "off");
    net->set_output_sums(on);
    const BatchNormRouteCount before = batch_norm_route_count();
    net->forward(images);
    const BatchNormRouteCount route = batch_norm_route_count() - before;
    const int64_t summed = on ? blocks + 1 : 0;
    EXPECT_EQ(route.output_sums, summed);
    EXPECT_EQ(route.statistics_passes, batch_norms - summed);
    EXPECT_EQ(route.backward_folds, on ? blocks : 0);
  }
  // A forward without a backward to come (evaluation under no_grad, a checkpointed block's first
  // pass) sums as training does but folds nothing.
  net->set_output_sums(true);
  const torch::NoGradGuard no_grad;
  const BatchNormRouteCount before = batch_norm_route_count();
  net->forward(images);
  const BatchNormRouteCount route = batch_norm_route_count() - before;
  EXPECT_EQ(route.output_sums, blocks + 1);
  EXPECT_EQ(route.backward_folds, 0);
}

// A backbone cut anywhere between blocks computes the whole network: what pipeline stages rely on.
// Every state-dict entry belongs to a block.
TEST(Backbone, BlocksComposeToTheWholeNetwork) {
  const std::pair<const char*, InputShape> nets[] = {{"r18", {3, 32, 32}},
                                                     {"mbf", {3, 112, 112}},
                                                     {"vit_t", {3, 18, 18}},
                                                     {"mobilefacenet", {3, 32, 32}},
                                                     {"smallcnn", {1, 16, 16}}};
  for (const auto& [name, shape] : nets) {
    torch::manual_seed(4);
    auto net = build(name, shape, 16);
    net->eval();
    torch::NoGradGuard no_grad;
    for (const auto& [entry, tensor] : net->state_dict()) {
      EXPECT_GE(net->block_of(entry), 0) << name << " " << entry;
    }
    const torch::Tensor images = torch::randn({2, shape.channels, shape.height, shape.width});
    const torch::Tensor whole = net->forward(images);
    for (const int64_t cut : {int64_t{1}, net->num_blocks() / 2, net->num_blocks() - 1}) {
      const Activations middle = net->forward_blocks({images, {}, {}}, 0, cut);
      const torch::Tensor joined = net->forward_blocks(middle, cut, net->num_blocks()).x;
      EXPECT_TRUE(torch::allclose(joined, whole, 1e-5, 1e-6)) << name << " cut at " << cut;
    }
  }
  EXPECT_EQ(build("r50", {3, 112, 112})->num_blocks(), 2 + 3 + 4 + 14 + 3);
  EXPECT_EQ(build("vit_t", {3, 112, 112})->num_blocks(), 2 + 12);
}

// Activation checkpointing recomputes blocks in backward: the same gradients, and batch norm's
// running statistics updated once per batch, not twice.
// On a GPU with channels-last maps batch norm runs its own kernels, which the recomputation reaches
// too, without updating the running statistics a second time.
TEST(Backbone, ActivationCheckpointingKeepsGradientsAndStatistics) {
  // Checkpointing, the route without output sums (each batch norm's own statistics pass, which
  // checkpointed blocks take too), and the one without backward folds, against the plain forward.
  struct Route {
    bool checkpointing, output_sums, folds;
  };
  const myriad::testing::ExactFloat32 exact;
  std::vector<torch::Device> devices{torch::kCPU};
  if (torch::cuda::is_available()) devices.emplace_back(torch::kCUDA);
  for (const torch::Device& device : devices) {
    SCOPED_TRACE(device.str());
    torch::manual_seed(3);
    const torch::Tensor images = torch::randn({4, 3, 32, 32}).to(device);
    const torch::Tensor projection = torch::randn({4, 16}).to(device);
    std::vector<std::shared_ptr<Backbone>> nets;
    for (const Route route : {Route{false, true, true}, Route{true, true, true},
                              Route{false, false, true}, Route{false, true, false}}) {
      const auto folds = myriad::testing::backward_folds(route.folds);
      torch::manual_seed(8);
      auto net = build("r18", {3, 32, 32}, 16);
      net->to(device);
      net->set_channels_last(device.is_cuda());
      net->set_activation_checkpointing(route.checkpointing);
      net->set_output_sums(route.output_sums);
      (net->forward(images) * projection).sum().backward();
      nets.push_back(net);
    }
    // One batch counted by every batch norm, as LibTorch's counts it (on a GPU, by the kernel that
    // finishes the statistics), and none by the recomputation.
    for (const auto& net : nets) {
      for (const auto& item : net->named_buffers()) {
        if (item.key().find("num_batches_tracked") != std::string::npos)
          EXPECT_EQ(item.value().item<int64_t>(), 1) << item.key();
      }
    }
    // Each gradient against the scale of them all: on a GPU cuDNN's backward convolutions need not
    // repeat bit for bit, and some gradients (the FC's bias before batch norm) are float noise.
    const auto plain = nets[0]->named_parameters();
    std::vector<torch::Tensor> flat;
    for (const auto& item : plain) {
      if (item.value().requires_grad()) flat.push_back(item.value().grad().reshape(-1).cpu());
    }
    const double scale = torch::cat(flat).norm().item<double>();
    for (size_t n = 1; n < nets.size(); ++n) {
      SCOPED_TRACE(n == 1 ? "checkpointing" : n == 2 ? "no output sums" : "no backward folds");
      const auto other = nets[n]->named_parameters();
      for (const auto& item : plain) {
        if (!item.value().requires_grad()) continue;
        EXPECT_LE((item.value().grad() - other[item.key()].grad()).norm().item<double>(),
                  1e-5 * scale)
            << item.key();
      }
      const auto a = nets[0]->named_buffers();
      const auto b = nets[n]->named_buffers();
      for (const auto& item : a) {
        EXPECT_TRUE(torch::allclose(item.value(), b[item.key()])) << item.key();
      }
    }
  }
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
