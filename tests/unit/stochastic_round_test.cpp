// Stochastic rounding to bfloat16 and the classifier optimizer's bfloat16 weights, against
// float64 references computed here.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "myriad/classifier/shard_optimizer.h"
#include "myriad/util/stochastic_round.h"

namespace myriad {
namespace {

float from_bits(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  std::memcpy(&value, &wide, sizeof value);
  return value;
}

// The two bfloat16 values around `value`, by truncation and one step up (same sign).
std::pair<float, float> neighbours(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const auto low = static_cast<uint16_t>(bits >> 16);
  return {from_bits(low), from_bits(static_cast<uint16_t>(low + 1))};
}

TEST(StochasticRound, RepresentableValuesStayAndOthersLandOnANeighbour) {
  for (float exact : {0.0f, 1.0f, -2.5f, 0.0078125f, from_bits(0x7F7F)}) {
    for (uint32_t random : {0x0u, 0x7FFFu, 0xFFFFu}) {
      EXPECT_EQ(from_bits(bf16_bits_stochastic(exact, random)), exact) << exact;
    }
  }
  for (float value : {1.001f, -1.001f, 3.14159f, -1.0e-20f, 65504.7f}) {
    const auto [low, high] = neighbours(value);
    for (uint32_t random = 0; random < 0x10000; random += 97) {
      const float rounded = from_bits(bf16_bits_stochastic(value, random));
      EXPECT_TRUE(rounded == low || rounded == high) << value << " -> " << rounded;
    }
  }
  EXPECT_TRUE(std::isnan(from_bits(bf16_bits_stochastic(std::nanf(""), 0xFFFF))));
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(from_bits(bf16_bits_stochastic(inf, 0xFFFF)), inf);
  EXPECT_EQ(from_bits(bf16_bits_stochastic(-inf, 0xFFFF)), -inf);
}

// The rounded value's mean over independent draws is the value itself: the probability of
// rounding up is the fraction of the gap covered.
TEST(StochasticRound, IsUnbiased) {
  constexpr int kDraws = 200000;
  for (float value : {1.0f + 0.3f / 128, -7.77f, 1.0e-3f}) {
    const auto [low, high] = neighbours(value);
    double sum = 0.0;
    for (int i = 0; i < kDraws; ++i) {
      sum += from_bits(bf16_bits_stochastic(value, rounding_bits(11, i)));
    }
    const double gap = std::abs(static_cast<double>(high) - low);
    // The mean of kDraws Bernoulli choices has a standard deviation of at most gap / (2 sqrt(n)).
    EXPECT_NEAR(sum / kDraws, value, 5.0 * gap / (2.0 * std::sqrt(kDraws))) << value;
  }
}

// One hash serves two neighbouring elements (its halves): each still rounds up with the fraction
// of the gap it covers, and the two independently of each other.
TEST(StochasticRound, TheElementsOfAPairRoundIndependently) {
  constexpr int64_t kPairs = 200000;
  const float value = 1.0f + 0.3f / 128;
  const auto [low, high] = neighbours(value);
  const double p = (static_cast<double>(value) - low) / (static_cast<double>(high) - low);
  int64_t first = 0, second = 0, both = 0;
  for (int64_t i = 0; i < kPairs; ++i) {
    const bool a = from_bits(bf16_bits_stochastic(value, rounding_bits(11, 2 * i))) == high;
    const bool b = from_bits(bf16_bits_stochastic(value, rounding_bits(11, 2 * i + 1))) == high;
    first += a;
    second += b;
    both += a && b;
  }
  // Five standard deviations of a Bernoulli mean over kPairs draws.
  const auto bound = [](double q) { return 5.0 * std::sqrt(q * (1.0 - q) / kPairs); };
  EXPECT_NEAR(static_cast<double>(first) / kPairs, p, bound(p));
  EXPECT_NEAR(static_cast<double>(second) / kPairs, p, bound(p));
  EXPECT_NEAR(static_cast<double>(both) / kPairs, p * p, bound(p * p));
}

// bfloat16 weights round by global element: a shard's rows updated in one call, in two calls, or
// as part of a shard that starts at another global class get the same bits; another seed rounds
// differently.
TEST(ShardOptimizerBf16, RoundingKeysOnTheGlobalRow) {
  OptimizerOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  const torch::Tensor start = torch::randn({6, 40}).to(torch::kBFloat16);
  const torch::Tensor grad = torch::randn({6, 40});
  const auto update = [&](int64_t first_row, int64_t rows, uint64_t seed,
                          const std::vector<int64_t>& splits) {
    ShardOptimizer optimizer(o, rows, 40, torch::kCPU, 100 + first_row, seed);
    optimizer.begin_step();
    torch::Tensor w = start.slice(0, first_row, first_row + rows).clone();
    for (size_t s = 0; s + 1 < splits.size(); ++s) {
      optimizer.update_rows(w, torch::Tensor(), splits[s], splits[s + 1],
                            grad.slice(0, first_row + splits[s], first_row + splits[s + 1]),
                            RowGradient::kRow, torch::Tensor());
    }
    return w;
  };
  const torch::Tensor whole = update(0, 6, 5, {0, 6});
  EXPECT_TRUE(torch::equal(whole, update(0, 6, 5, {0, 2, 6})));
  EXPECT_TRUE(torch::equal(whole.slice(0, 2, 4), update(2, 2, 5, {0, 2})));
  EXPECT_FALSE(torch::equal(whole, update(0, 6, 6, {0, 6})));
  // Every element within one bfloat16 step of the float32 update.
  const torch::Tensor exact =
      start.to(torch::kFloat32) - 0.05 * (grad + 5e-4 * start.to(torch::kFloat32));
  EXPECT_LE((whole.to(torch::kFloat32) - exact).abs().div(exact.abs()).max().item<float>(),
            1.01f / 128);
}

// Updates far below half a bfloat16 step: round-to-nearest would leave every weight where it
// was; stochastic rounding moves the mean by the update.
TEST(ShardOptimizerBf16, TinyUpdatesMoveTheWeightsOnAverage) {
  const int64_t rows = 64, dim = 512;
  OptimizerOptions o;
  o.lr = 1e-4;
  o.momentum = 0.0;
  o.weight_decay = 0.0;
  ShardOptimizer optimizer(o, rows, dim, torch::kCPU, 1000, 3);
  torch::Tensor weight = torch::ones({rows, dim}, torch::kBFloat16);
  const torch::Tensor grad = torch::ones({rows, dim});
  double expected = 1.0;
  for (int step = 0; step < 4; ++step) {
    optimizer.begin_step();
    optimizer.update_rows(weight, torch::Tensor(), 0, rows, grad, RowGradient::kRow,
                          torch::Tensor());
    expected -= 1e-4;
  }
  const torch::Tensor w = weight.to(torch::kFloat64);
  // The weights sit on bfloat16 values either side of 1: 1 - 2^-8 and 1.
  EXPECT_GT(w.lt(1.0).sum().item<int64_t>(), 0);
  // Each step's rounding error has a standard deviation of at most half a step, 2^-9 here.
  const double tolerance =
      5.0 * 2.0 * std::pow(2.0, -9) / std::sqrt(static_cast<double>(rows * dim));
  EXPECT_NEAR(w.mean().item<double>(), expected, tolerance);
}

// bfloat16 weights follow the float32 update (SGD with momentum, normalised rows) within one
// bfloat16 rounding per step, and a CUDA update draws the same rounding as the CPU's, whether the
// kernels access four elements at a time or one.
class ShardOptimizerBf16Dims : public ::testing::TestWithParam<int64_t> {};

TEST_P(ShardOptimizerBf16Dims, FollowsTheFloat32UpdateOnEveryDevice) {
  const int64_t rows = 24, dim = GetParam();
  OptimizerOptions o;
  o.lr = 0.05;
  o.momentum = 0.9;
  o.weight_decay = 1e-3;
  const torch::Tensor start = torch::randn({rows, dim}).mul_(0.1);
  const torch::Tensor grad = torch::randn({rows, dim});
  const torch::Tensor index = torch::tensor({3, 7, 8, 20, 1}, torch::kInt64);
  std::vector<torch::Device> devices = {torch::kCPU};
  if (torch::cuda::is_available()) devices.emplace_back(torch::kCUDA);
  torch::Tensor cpu_result;
  for (const torch::Device& device : devices) {
    ShardOptimizer exact(o, rows, dim, device, 50, 9);
    ShardOptimizer rounded(o, rows, dim, device, 50, 9);
    torch::Tensor w32 = start.to(device).to(torch::kBFloat16).to(torch::kFloat32);
    torch::Tensor w16 = start.to(device).to(torch::kBFloat16);
    const torch::Tensor g = grad.to(device);
    const torch::Tensor active = index.to(device);
    for (int step = 0; step < 3; ++step) {
      exact.begin_step();
      rounded.begin_step();
      exact.update_rows(w32, torch::Tensor(), 0, rows, g, RowGradient::kUnitRow, torch::Tensor());
      rounded.update_rows(w16, torch::Tensor(), 0, rows, g, RowGradient::kUnitRow, torch::Tensor());
      exact.update_rows(w32, active, 1, 4, g.slice(0, 0, 3), RowGradient::kUnitRow,
                        torch::Tensor());
      rounded.update_rows(w16, active, 1, 4, g.slice(0, 0, 3), RowGradient::kUnitRow,
                          torch::Tensor());
    }
    const torch::Tensor diff = (w16.to(torch::kFloat32) - w32).abs().cpu();
    // Each step rounds by less than one bfloat16 step (2^-7 relative); three steps, with
    // momentum carrying earlier roundings into later updates, stay within a few steps of the
    // element, or of the typical weight where an element crosses zero.
    const torch::Tensor bound =
        (w32.abs().cpu() + 0.5 * w32.square().mean().sqrt().cpu()).mul_(4.0 / 128);
    EXPECT_TRUE(diff.le(bound).all().item<bool>())
        << device.str() << ": worst " << diff.div(bound).max().item<float>() << " of the bound";
    EXPECT_GT(diff.max().item<float>(), 0.0f) << device.str() << ": no rounding happened";
    if (device.is_cpu()) {
      cpu_result = w16.to(torch::kFloat32);
    } else {
      // The same random bits round the same float32 values; float32 arithmetic may differ in
      // its last bit between devices and move an element by one bfloat16 step at most.
      const torch::Tensor moved = w16.cpu().to(torch::kFloat32).ne(cpu_result);
      EXPECT_LE(moved.sum().item<int64_t>(), rows * dim / 100) << "CUDA rounds unlike the CPU";
    }
  }
}

// 96: four elements per access; 1101: one (rows not aligned to four elements).
INSTANTIATE_TEST_SUITE_P(Dims, ShardOptimizerBf16Dims, ::testing::Values(96, 1101));

}  // namespace
}  // namespace myriad
