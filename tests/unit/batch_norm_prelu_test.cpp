// BatchNormImpl::forward, forward_prelu, forward_add and forward_fork against batch norm (and
// PReLU, or a residual's add, or a second use of the input) composed by LibTorch in float64 on the
// CPU: the output, the gradients of the input, of the residual and of the parameters, and the
// running statistics. On a GPU the channels-last maps and [N, C] matrices take myriad's kernels
// (checked by the autograd node), in float32 and bfloat16; everything else, and the CPU, takes
// LibTorch's batch norm. Then the sums that a pass forms for the next batch norm (SummedMap), from
// myriad's kernels and from cuDNN's convolutions, and the backward sums that the next batch norm's
// backward forms for the one before it (BackwardFold).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>

#include "myriad/model/batch_norm.h"
#include "myriad/util/autocast.h"
#include "myriad/util/format.h"
#include "support/model_switch.h"
#include "support/reference_softmax.h"

namespace myriad::testing {
namespace {

struct Case {
  std::vector<int64_t> shape;
  bool channels_last;
  bool shared_slope;      // one PReLU slope for every channel
  bool prelu = true;      // false: batch norm alone (forward)
  bool residual = false;  // batch norm plus a residual (forward_add), without PReLU
  bool fork = false;      // batch norm alone, its input used again (forward_fork)
};

void expect_matches_composition(const torch::Device& device, torch::ScalarType dtype, const Case& c,
                                double tolerance, bool fused) {
  const int64_t channels = c.shape[1];
  torch::manual_seed(static_cast<uint64_t>(channels * 7 + c.shape.size()));
  // Off-centre inputs and slopes of both signs: the statistics and both PReLU branches matter.
  const torch::Tensor x64 = torch::randn(c.shape, torch::kFloat64) * 3.0 + 1.5;
  const torch::Tensor g64 = torch::randn(c.shape, torch::kFloat64);
  const torch::Tensor gamma = torch::rand({channels}, torch::kFloat64) + 0.5;
  const torch::Tensor beta = torch::randn({channels}, torch::kFloat64);
  const torch::Tensor alpha = torch::rand({c.shared_slope ? 1 : channels}, torch::kFloat64) - 0.5;
  const torch::Tensor running_mean = torch::randn({channels}, torch::kFloat64);
  const torch::Tensor running_var = torch::rand({channels}, torch::kFloat64) + 0.5;
  const torch::Tensor r64 = torch::randn(c.shape, torch::kFloat64);

  BatchNorm bn(channels, 1e-5);
  bn->to(device);
  {
    torch::NoGradGuard no_grad;
    bn->weight.copy_(gamma);
    bn->bias.copy_(beta);
    bn->running_mean.copy_(running_mean);
    bn->running_var.copy_(running_var);
  }
  const torch::Tensor slope = alpha.to(device, torch::kFloat32).requires_grad_(true);
  // What the kernels see: the input rounded to `dtype`; the reference starts from the same values.
  torch::Tensor x = x64.to(device, dtype);
  torch::Tensor residual = r64.to(device, dtype);
  if (c.channels_last) {
    x = x.contiguous(torch::MemoryFormat::ChannelsLast);
    residual = residual.contiguous(torch::MemoryFormat::ChannelsLast);
  }
  x.requires_grad_(true);
  residual.requires_grad_(true);
  torch::Tensor y, second_use;
  {
    // Half precision as the trainer runs it: under autocast, where the composition's PReLU takes
    // float32.
    std::optional<AutocastGuard> autocast;
    if (dtype != torch::kFloat32) autocast.emplace(device, dtype);
    if (c.fork) {
      std::tie(y, second_use) = bn->forward_fork(x);
    } else {
      y = c.residual ? bn->forward_add(x, residual)
          : c.prelu  ? bn->forward_prelu(x, slope)
                     : bn->forward(x);
    }
  }
  const std::string node = y.grad_fn() ? y.grad_fn()->name() : "";
  EXPECT_EQ(node.find("BatchNormPReLU") != std::string::npos, fused) << node;
  // What start-up lines report for a backbone's maps (NCHW maps never take the kernels).
  if (c.shape.size() == 4) {
    EXPECT_EQ(batch_norm_runs_own_kernels(device, false, c.channels_last), fused);
  }
  // The second use's gradient: the residual's values, which the reference adds to the input's.
  if (c.fork) {
    EXPECT_TRUE(torch::equal(second_use, x));
    torch::autograd::backward({y, second_use},
                              {g64.to(device, y.scalar_type()), residual.detach()});
  } else {
    y.backward(g64.to(device, y.scalar_type()));
  }

  const torch::Tensor rx = x64.to(dtype).to(torch::kFloat64).requires_grad_(true);
  const torch::Tensor rgamma = gamma.clone().requires_grad_(true);
  const torch::Tensor rbeta = beta.clone().requires_grad_(true);
  const torch::Tensor ralpha = alpha.clone().requires_grad_(true);
  const torch::Tensor rmean = running_mean.clone(), rvar = running_var.clone();
  const torch::Tensor rbn =
      torch::batch_norm(rx, rgamma, rbeta, rmean, rvar, true, 0.1, 1e-5, false);
  const torch::Tensor rresidual = r64.to(dtype).to(torch::kFloat64).requires_grad_(true);
  const torch::Tensor ry = c.residual ? rbn + rresidual : c.prelu ? torch::prelu(rbn, ralpha) : rbn;
  if (c.fork) {
    torch::autograd::backward({ry, rx}, {g64.to(dtype).to(torch::kFloat64), rresidual.detach()});
  } else {
    ry.backward(g64.to(dtype).to(torch::kFloat64));
  }

  EXPECT_LE(relative_error(y, ry), tolerance) << "output";
  EXPECT_LE(relative_error(x.grad(), rx.grad()), tolerance) << "input's gradient";
  EXPECT_LE(relative_error(bn->weight.grad(), rgamma.grad()), tolerance) << "gamma's gradient";
  EXPECT_LE(relative_error(bn->bias.grad(), rbeta.grad()), tolerance) << "beta's gradient";
  if (c.residual) {
    EXPECT_LE(relative_error(residual.grad(), rresidual.grad()), tolerance)
        << "residual's gradient";
  } else if (c.prelu && !c.fork) {
    EXPECT_LE(relative_error(slope.grad(), ralpha.grad()), tolerance) << "slope's gradient";
  }
  EXPECT_LE(relative_error(bn->running_mean, rmean), 1e-5) << "running mean";
  EXPECT_LE(relative_error(bn->running_var, rvar), 1e-5) << "running variance";
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 1);
}

const Case kCases[] = {{{8, 64, 7, 5}, true, false},
                       {{6, 32}, false, false},
                       {{4, 24, 3, 3}, false, false},
                       {{5, 16, 4, 4}, true, true},
                       {{3, 12, 5, 5}, true, false},  // 12 channels: no 16-byte packs in bf16
                       {{8, 64, 7, 5}, true, false, false},
                       {{6, 32}, false, false, false},
                       {{4, 24, 3, 3}, false, false, false},
                       // More rows than the statistics' blocks take in one sweep: several sweeps.
                       {{64, 8, 40, 40}, true, false, false},
                       {{8, 64, 7, 5}, true, false, false, true},
                       {{6, 32}, false, false, false, true},
                       {{4, 24, 3, 3}, false, false, false, true},
                       {{3, 12, 5, 5}, true, false, false, true},
                       {{8, 64, 7, 5}, true, false, false, false, true},
                       {{6, 32}, false, false, false, false, true},
                       {{4, 24, 3, 3}, false, false, false, false, true},
                       {{3, 12, 5, 5}, true, false, false, false, true}};

std::string describe(const Case& c) {
  return str_format("{}{}{}{}{}{}", c10::IntArrayRef(c.shape),
                    c.channels_last ? " channels-last" : "", c.shared_slope ? ", one slope" : "",
                    c.prelu ? "" : ", no PReLU", c.residual ? ", plus a residual" : "",
                    c.fork ? ", its input used again" : "");
}

TEST(BatchNormPReLU, ComposesOnTheCpu) {
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    expect_matches_composition(torch::kCPU, torch::kFloat32, c, 1e-5, false);
  }
}

TEST(BatchNormPReLU, FusedOnGpusMatchesTheComposition) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  for (const Case& c : kCases) {
    SCOPED_TRACE(describe(c));
    const bool fused = c.channels_last || c.shape.size() == 2;
    expect_matches_composition(torch::kCUDA, torch::kFloat32, c, 1e-5, fused);
    // bfloat16 output and gradients: 8 bits of mantissa.
    expect_matches_composition(torch::kCUDA, torch::kBFloat16, c, 1e-2, fused);
  }
}

// The statistics, the output's sums and the backward sums over rows in a fixed order, without
// atomics, also where a backward forms the sums of the batch norm before it: the same bits at every
// run, as --deterministic promises.
TEST(BatchNormPReLU, FusedGradientsAreTheSameBitsEveryRun) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  torch::manual_seed(8);
  const auto map = [](double scale, double offset) {
    return (torch::randn({32, 64, 14, 14}) * scale + offset)
        .to(torch::kCUDA)
        .contiguous(torch::MemoryFormat::ChannelsLast);
  };
  const torch::Tensor x = map(2.0, 0.5), residual = map(1.0, 1.0), g = map(1.0, 0.0);
  std::vector<torch::Tensor> runs;
  for (int run = 0; run < 2; ++run) {
    BatchNorm bn(64, 1e-5), added(64, 1e-5), next(64, 1e-5);
    for (BatchNorm b : {bn, added, next}) b->to(torch::kCUDA);
    const torch::Tensor slope = torch::full({64}, 0.25, torch::kCUDA).requires_grad_(true);
    const torch::Tensor input = x.clone().requires_grad_(true);
    // The first batch norm's statistics from its pass, the others' from the sums the one before
    // formed; the second one's backward sums from the third one's backward.
    const SummedMap out = bn->forward_prelu(SummedMap{input}, slope, /*sum_output=*/true);
    const SummedMap sum = added->forward_add(out, residual, /*sum_output=*/true);
    const auto [y, second] = next->forward_fork(sum);
    torch::autograd::backward({y, second}, {g, g});
    runs.push_back(torch::cat(
        {y.reshape(-1), out.sums.reshape(-1), sum.sums.reshape(-1), input.grad().reshape(-1),
         bn->weight.grad(), bn->bias.grad(), slope.grad(), added->weight.grad(), added->bias.grad(),
         bn->running_mean, bn->running_var, next->running_mean, next->running_var}));
  }
  EXPECT_TRUE(torch::equal(runs[0], runs[1]));
}

// Σ y and Σ y² per channel [2, C] in float64, from a SummedMap's sums of y - shift over its blocks.
torch::Tensor channel_sums(const SummedMap& map) {
  const torch::Tensor s = map.sums.cpu().to(torch::kFloat64).sum(0);
  if (!map.shift.defined()) return s;
  const double n = static_cast<double>(map.y.numel() / map.y.size(1));
  const torch::Tensor shift = map.shift.cpu().to(torch::kFloat64);
  return torch::stack({s[0] + n * shift, s[1] + 2.0 * shift * s[0] + n * shift.square()});
}

// Σ y and Σ y² per channel [2, C] of y as stored, in float64.
torch::Tensor channel_sums(const torch::Tensor& y) {
  const torch::Tensor v =
      y.detach().cpu().to(torch::kFloat64).transpose(0, 1).reshape({y.size(1), -1});
  return torch::stack({v.sum(1), v.square().sum(1)});
}

// A batch norm (with PReLU, or plus a residual) forming its output's sums for the next batch norm,
// as IResNet's blocks hand them on: the sums are the output's, and the next batch norm, taking its
// statistics from them, computes what it computes from the output alone, forward and backward.
// Where LibTorch's batch norm runs (the CPU) no sums are formed.
void expect_output_sums_serve_the_next(const torch::Device& device, torch::ScalarType dtype,
                                       const Case& c, double tolerance) {
  const int64_t channels = c.shape[1];
  torch::manual_seed(static_cast<uint64_t>(channels * 5 + c.shape.size()));
  const auto map = [&](double scale, double offset) {
    const torch::Tensor t = (torch::randn(c.shape) * scale + offset).to(device, dtype);
    return c.shape.size() == 4 ? t.contiguous(torch::MemoryFormat::ChannelsLast) : t;
  };
  const torch::Tensor x = map(3.0, 1.5).requires_grad_(true);
  // An output whose mean is well off zero: the shift must carry it.
  const torch::Tensor residual = map(1.0, 40.0);
  const torch::Tensor slope = torch::full({channels}, 0.25, device);
  BatchNorm first(channels, 1e-5), next(channels, 1e-5), alone(channels, 1e-5);
  for (BatchNorm bn : {first, next, alone}) bn->to(device);
  SummedMap out;
  torch::Tensor y_next, y_alone;
  {
    std::optional<AutocastGuard> autocast;
    if (dtype != torch::kFloat32) autocast.emplace(device, dtype);
    out = c.residual ? first->forward_add(SummedMap{x}, residual, /*sum_output=*/true)
                     : first->forward_prelu(SummedMap{x}, slope, /*sum_output=*/true);
    y_next = next->forward_output(out);
    y_alone = alone->forward(out.y);
  }
  if (device.is_cpu()) {
    EXPECT_FALSE(out.sums.defined());
  } else {
    ASSERT_TRUE(out.sums.defined() && out.shift.defined());
    ASSERT_EQ(out.sums.dim(), 3);
    EXPECT_EQ(out.sums.size(1), 2);
    EXPECT_EQ(out.sums.size(2), channels);
    EXPECT_EQ(out.shift.numel(), channels);
    const torch::Tensor expected = channel_sums(out.y), got = channel_sums(out);
    EXPECT_LE(relative_error(got[0], expected[0]), 1e-5) << "Σ y";
    EXPECT_LE(relative_error(got[1], expected[1]), 1e-5) << "Σ y²";
  }
  const torch::Tensor g = torch::randn(y_next.sizes()).to(device, y_next.scalar_type());
  const torch::Tensor dx_next = torch::autograd::grad({y_next}, {x}, {g}, /*retain_graph=*/true)[0];
  const torch::Tensor dx_alone = torch::autograd::grad({y_alone}, {x}, {g})[0];
  EXPECT_LE(relative_error(y_next, y_alone), tolerance) << "output";
  EXPECT_LE(relative_error(dx_next, dx_alone), tolerance) << "input's gradient";
  EXPECT_LE(relative_error(next->running_mean, alone->running_mean), 1e-5) << "running mean";
  EXPECT_LE(relative_error(next->running_var, alone->running_var), 1e-5) << "running variance";
  if (device.is_cpu()) return;
  // The next batch norm takes its mean from the sums, alone or with its input used again (IResNet's
  // bn1): a shift moved by 1 moves the mean by 1, and the running mean by the momentum.
  SummedMap moved = out;
  moved.shift = out.shift + 1.0;
  BatchNorm shifted(channels, 1e-5), forked(channels, 1e-5);
  {
    torch::NoGradGuard no_grad;
    for (BatchNorm bn : {shifted, forked}) bn->to(device);
    shifted->forward_output(moved);
    forked->forward_fork(moved);
  }
  for (BatchNorm bn : {shifted, forked}) {
    EXPECT_NEAR((bn->running_mean - alone->running_mean).mean().item<double>(), 0.1, 1e-3);
  }
}

const Case kSumCases[] = {{{8, 64, 7, 5}, true, false},
                          {{6, 32}, false, false},
                          {{3, 12, 5, 5}, true, false},    // 12 channels: no 16-byte packs in bf16
                          {{64, 8, 40, 40}, true, false},  // several sweeps of the blocks
                          {{8, 64, 7, 5}, true, false, false, true},
                          {{3, 12, 5, 5}, true, false, false, true},
                          {{64, 8, 40, 40}, true, false, false, true}};

TEST(BatchNormPReLU, OutputSumsAreFormedOnlyByTheKernels) {
  for (const Case& c : kSumCases) {
    SCOPED_TRACE(describe(c));
    expect_output_sums_serve_the_next(torch::kCPU, torch::kFloat32, c, 1e-6);
  }
}

TEST(BatchNormPReLU, OutputSumsGiveTheNextBatchNormsStatistics) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  for (const Case& c : kSumCases) {
    SCOPED_TRACE(describe(c));
    expect_output_sums_serve_the_next(torch::kCUDA, torch::kFloat32, c, 1e-5);
    expect_output_sums_serve_the_next(torch::kCUDA, torch::kBFloat16, c, 1e-2);
  }
}

// A batch norm plus a residual (IResNet's bn3) summing its output, and the batch norm that reads it
// next, its input used again (the next block's bn1) or not (the head's bn2), against the two
// composed by LibTorch in float64 on the CPU, with and without folds. Where the first output has a
// third use, its gradient is no longer the one the fold summed: the first batch norm's own pass
// must form its sums, or its gradients miss the third use's. Backward runs twice over the kept
// graph, the second time without the fold (its first run released it), and the gradients add up.
struct FoldCase {
  std::vector<int64_t> shape;
  bool fork, third_use;
};

void expect_fold_matches_composition(torch::ScalarType dtype, const FoldCase& c, bool folds,
                                     double tolerance) {
  const torch::Device gpu(torch::kCUDA);
  const int64_t channels = c.shape[1];
  torch::manual_seed(static_cast<uint64_t>(channels * 11 + c.shape.size()));
  const auto draw = [&](double scale, double offset) {
    return torch::randn(c.shape, torch::kFloat64) * scale + offset;
  };
  const torch::Tensor x64 = draw(3.0, 1.5), r64 = draw(1.0, 4.0);
  const torch::Tensor dy64[3] = {draw(1.0, 0.0), draw(1.0, 0.0), draw(1.0, 0.0)};
  const torch::Tensor gamma = torch::rand({2, channels}, torch::kFloat64) + 0.5;
  const torch::Tensor beta = torch::randn({2, channels}, torch::kFloat64);
  BatchNorm bns[2] = {BatchNorm(channels, 1e-5), BatchNorm(channels, 1e-5)};
  for (int i = 0; i < 2; ++i) {
    bns[i]->to(gpu);
    torch::NoGradGuard no_grad;
    bns[i]->weight.copy_(gamma[i]);
    bns[i]->bias.copy_(beta[i]);
  }
  const auto on_gpu = [&](const torch::Tensor& t) {
    const torch::Tensor d = t.to(gpu, dtype);
    return c.shape.size() == 4 ? d.contiguous(torch::MemoryFormat::ChannelsLast) : d;
  };
  const torch::Tensor x = on_gpu(x64).requires_grad_(true);
  const torch::Tensor residual = on_gpu(r64).requires_grad_(true);
  const auto switched = backward_folds(folds);
  const BatchNormRouteCount before = batch_norm_route_count();
  std::vector<torch::Tensor> outputs(1);
  {
    std::optional<AutocastGuard> autocast;
    if (dtype != torch::kFloat32) autocast.emplace(gpu, dtype);
    const SummedMap out = bns[0]->forward_add(SummedMap{x}, residual, /*sum_output=*/true);
    if (c.fork) {
      outputs.resize(2);
      std::tie(outputs[0], outputs[1]) = bns[1]->forward_fork(out);
    } else {
      outputs[0] = bns[1]->forward_output(out);
    }
    if (c.third_use) outputs.push_back(out.y);
  }
  EXPECT_EQ((batch_norm_route_count() - before).backward_folds, folds ? 1 : 0);
  std::vector<torch::Tensor> grads;
  for (size_t i = 0; i < outputs.size(); ++i) grads.push_back(on_gpu(dy64[i]));
  torch::autograd::backward(outputs, grads, /*retain_graph=*/true);
  torch::autograd::backward(outputs, grads);

  const auto reference = [&](const torch::Tensor& t) {
    return t.to(dtype).to(torch::kFloat64).requires_grad_(true);
  };
  const torch::Tensor rx = reference(x64), rresidual = reference(r64);
  const torch::Tensor rgamma = gamma.clone().requires_grad_(true);
  const torch::Tensor rbeta = beta.clone().requires_grad_(true);
  const torch::Tensor ry1 =
      torch::batch_norm(rx, rgamma[0], rbeta[0], {}, {}, true, 0.1, 1e-5, false) + rresidual;
  std::vector<torch::Tensor> routputs{
      torch::batch_norm(ry1, rgamma[1], rbeta[1], {}, {}, true, 0.1, 1e-5, false)};
  if (c.fork) routputs.push_back(ry1);
  if (c.third_use) routputs.push_back(ry1);
  std::vector<torch::Tensor> rgrads;
  for (size_t i = 0; i < routputs.size(); ++i)
    rgrads.push_back(dy64[i].to(dtype).to(torch::kFloat64));
  torch::autograd::backward(routputs, rgrads);

  // Each error against the reference's norm; the betas' against the incoming gradient's where that
  // is larger: without a second or third use, the first beta's gradient, Σ dy over the rows, is 0
  // up to rounding (the second batch norm's input gradient sums to 0 per channel).
  const auto expect_twice = [&](const torch::Tensor& got, const torch::Tensor& once,
                                const std::string& what, double floor = 0.0) {
    const torch::Tensor expected = 2.0 * once.detach();
    const double error = (got.detach().cpu().to(torch::kFloat64) - expected).norm().item<double>();
    EXPECT_LE(error / std::max(expected.norm().item<double>(), 2.0 * floor), tolerance) << what;
  };
  expect_twice(x.grad(), rx.grad(), "input's gradient");
  expect_twice(residual.grad(), rresidual.grad(), "residual's gradient");
  const double incoming = dy64[0].norm().item<double>();
  for (int i = 0; i < 2; ++i) {
    expect_twice(bns[i]->weight.grad(), rgamma.grad()[i], str_format("batch norm {}'s gamma", i));
    expect_twice(bns[i]->bias.grad(), rbeta.grad()[i], str_format("batch norm {}'s beta", i),
                 incoming);
  }
}

TEST(BatchNormPReLU, BackwardFoldsMatchTheComposition) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const FoldCase cases[] = {{{8, 64, 7, 5}, true, false},   {{6, 32}, false, false},
                            {{3, 12, 5, 5}, true, false},    // no 16-byte packs in bf16
                            {{64, 8, 40, 40}, true, false},  // several sweeps of the blocks
                            {{8, 64, 7, 5}, true, true},    {{6, 32}, false, true}};
  for (const FoldCase& c : cases) {
    for (const bool folds : {true, false}) {
      SCOPED_TRACE(str_format("{}{}{}, folds {}", c10::IntArrayRef(c.shape),
                              c.fork ? ", its input used again" : "",
                              c.third_use ? ", a third use" : "", folds ? "on" : "off"));
      expect_fold_matches_composition(torch::kFloat32, c, folds, 1e-4);
      // Two batch norms in a row, each output rounded to 8 or 11 bits of mantissa.
      expect_fold_matches_composition(torch::kBFloat16, c, folds, 2e-2);
      expect_fold_matches_composition(torch::kFloat16, c, folds, 4e-3);
    }
  }
}

// A convolution followed by batch norm and PReLU through BatchNormImpl::convolve, against the
// same function composed by LibTorch in float64 on the CPU from the same rounded inputs. Returns
// whether the convolution formed the sums (cuDNN had an engine for the shape).
struct ConvCase {
  int64_t channels, out_channels, kernel, stride, size;
};

bool expect_convolve_matches_composition(const torch::Device& device, torch::ScalarType dtype,
                                         const ConvCase& c, double tolerance) {
  torch::manual_seed(static_cast<uint64_t>(c.channels * 3 + c.stride));
  const std::vector<int64_t> shape{8, c.channels, c.size, c.size};
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(c.channels, c.out_channels, c.kernel)
                             .stride(c.stride)
                             .padding(c.kernel / 2)
                             .bias(false));
  BatchNorm bn(c.out_channels, 1e-5);
  const torch::Tensor w64 = conv->weight.detach().to(torch::kFloat64);
  // Off-centre maps: the convolution's outputs have means beside their spread, which the
  // statistics from sums must keep apart.
  const torch::Tensor x64 = torch::randn(shape, torch::kFloat64) + 2.0;
  const torch::Tensor slope = torch::full({c.out_channels}, 0.25, device).requires_grad_(true);
  conv->to(device);
  bn->to(device);
  const torch::Tensor x = x64.to(device, torch::kFloat32)
                              .contiguous(torch::MemoryFormat::ChannelsLast)
                              .requires_grad_(true);
  SummedMap out;
  torch::Tensor y;
  {
    std::optional<AutocastGuard> autocast;
    if (dtype != torch::kFloat32) autocast.emplace(device, dtype);
    out = bn->convolve(*conv, x);
    y = bn->forward_prelu(out, slope).y;
  }
  const torch::Tensor g64 = torch::randn(y.sizes(), torch::kFloat64);
  y.backward(g64.to(device, y.scalar_type()));

  // The reference sees the inputs as the convolution does: rounded to `dtype`.
  const auto rounded = [&](const torch::Tensor& t) {
    return t.to(dtype).to(torch::kFloat64).requires_grad_(true);
  };
  const torch::Tensor rx = rounded(x64), rw = rounded(w64);
  const torch::Tensor rz = torch::conv2d(rx, rw, {}, c.stride, c.kernel / 2);
  const torch::Tensor rmean = torch::zeros({c.out_channels}, torch::kFloat64);
  const torch::Tensor rvar = torch::ones({c.out_channels}, torch::kFloat64);
  const torch::Tensor rslope = torch::full({c.out_channels}, 0.25, torch::kFloat64);
  const torch::Tensor ry =
      torch::prelu(torch::batch_norm(rz, {}, {}, rmean, rvar, true, 0.1, 1e-5, false), rslope);
  ry.backward(g64);
  if (out.sums.defined()) {
    const torch::Tensor expected = channel_sums(out.y), got = channel_sums(out);
    EXPECT_LE(relative_error(got[0], expected[0]), 1e-3) << "Σ y";
    EXPECT_LE(relative_error(got[1], expected[1]), 1e-3) << "Σ y²";
  }
  EXPECT_LE(relative_error(y, ry), tolerance) << "output";
  EXPECT_LE(relative_error(x.grad(), rx.grad()), tolerance) << "input's gradient";
  EXPECT_LE(relative_error(conv->weight.grad(), rw.grad()), tolerance) << "weight's gradient";
  EXPECT_LE(relative_error(bn->running_mean, rmean), tolerance) << "running mean";
  EXPECT_LE(relative_error(bn->running_var, rvar), tolerance) << "running variance";
  return out.sums.defined();
}

const ConvCase kConvCases[] = {
    {64, 64, 3, 1, 14}, {64, 128, 3, 2, 14}, {64, 128, 1, 2, 14}, {16, 32, 3, 1, 28}};

// Where the convolution cannot form the sums (the CPU, float32) it is the plain convolution.
TEST(BatchNormPReLU, ConvolveIsThePlainConvolutionOnTheCpu) {
  for (const ConvCase& c : kConvCases) {
    EXPECT_FALSE(expect_convolve_matches_composition(torch::kCPU, torch::kFloat32, c, 1e-5));
  }
}

// On GPUs with cuDNN's graph API the convolution writes its output's sums, and batch norm takes
// its statistics from them: the same function, forward and backward, at half precision's
// tolerance. Skipped where cuDNN has no engine for any of the shapes (the reason is printed).
TEST(BatchNormPReLU, ConvolutionSumsGiveTheBatchNormsStatistics) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  if (!convolution_statistics_built()) GTEST_SKIP() << "built without cuDNN's graph API";
  // The gradients pass through 16-bit maps and a 16-bit backward: bfloat16 keeps 3 bits less than
  // float16, and the plain path's gradients are as far from float64's as the fused path's.
  const auto tolerance = [](torch::ScalarType dtype) {
    return dtype == torch::kBFloat16 ? 5e-2 : 2e-2;
  };
  int fused = 0;
  {
    const auto on = convolution_statistics_on();
    for (const torch::ScalarType dtype : {torch::kBFloat16, torch::kFloat16}) {
      for (const ConvCase& c : kConvCases) {
        SCOPED_TRACE(str_format("{} -> {}, {}x{} stride {}, {}", c.channels, c.out_channels,
                                c.kernel, c.kernel, c.stride, c10::toString(dtype)));
        fused += expect_convolve_matches_composition(torch::kCUDA, dtype, c, tolerance(dtype));
      }
    }
    std::printf("convolutions forming their sums: %s\n", convolution_statistics_state().c_str());
  }
  // The process's report counts each of the 8 shapes (other tests may have added more), and the
  // time their plans took.
  const ConvolutionStatisticsReport report = convolution_statistics_report();
  EXPECT_GE(report.planned, fused);
  EXPECT_GE(report.planned + report.unplanned, 8);
  EXPECT_GT(report.build_seconds, 0.0);
  EXPECT_EQ(report.first_reason.empty(), report.unplanned == 0);
  if (fused == 0) GTEST_SKIP() << "cuDNN formed no sums: " << convolution_statistics_state();
  // Off, the same convolutions take the statistics pass.
  EXPECT_FALSE(expect_convolve_matches_composition(torch::kCUDA, torch::kBFloat16, kConvCases[0],
                                                   tolerance(torch::kBFloat16)));
}

}  // namespace
}  // namespace myriad::testing
