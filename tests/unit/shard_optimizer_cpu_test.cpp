// The classifier optimizer's CPU row loop: each row's gradient formed from the logits' gradient
// against the same update on a gradient that LibTorch multiplied out, and the bfloat16 stores'
// rounding bits against rounding_bits element by element.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "classifier/cpu_bf16_products.h"
#include "myriad/classifier/shard_optimizer.h"
#include "myriad/util/error.h"
#include "myriad/util/stochastic_round.h"

namespace myriad {
namespace {

double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.to(torch::kFloat64), y = b.to(torch::kFloat64);
  return ((x - y).norm() / y.norm()).item<double>();
}

// Three steps of `kind` on rows [1, 6) of 7 (listed by `index` where given), one given the
// rows' gradient dz . x multiplied out in float64, the other dz and x.
void expect_product_matches_multiplied(OptimizerKind kind, torch::ScalarType dz_dtype,
                                       torch::ScalarType x_dtype, RowGradient grad_of,
                                       bool listed) {
  // 83 columns: a block of 64, one of 16 and three alone.
  const int64_t rows = 7, dim = 83, batch = 19;
  OptimizerOptions o;
  o.kind = kind;
  o.lr = kind == OptimizerKind::kSgd ? 0.3 : 0.01;
  o.momentum = 0.9;
  o.weight_decay = 0.01;
  torch::manual_seed(3);
  const torch::Tensor start = torch::randn({rows, dim});
  const torch::Tensor index = listed ? torch::tensor({6, 0, 2, 5, 3, 1}) : torch::Tensor();
  ShardOptimizer multiplied(o, rows, dim, torch::kCPU, 0, 1);
  ShardOptimizer product(o, rows, dim, torch::kCPU, 0, 1);
  torch::Tensor w_multiplied = start.clone(), w_product = start.clone();
  for (int step = 0; step < 3; ++step) {
    const torch::Tensor dz = torch::randn({5, batch}).to(dz_dtype);
    const torch::Tensor x = torch::randn({batch, dim}).to(x_dtype);
    const torch::Tensor grad =
        dz.to(torch::kFloat64).matmul(x.to(torch::kFloat64)).to(torch::kFloat32);
    multiplied.begin_step();
    product.begin_step();
    multiplied.update_rows(w_multiplied, index, 1, 6, grad, grad_of, torch::Tensor());
    product.update_rows_from_product(w_product, index, 1, 6, dz, x, grad_of, torch::Tensor());
  }
  const std::string label = std::string(optimizer_name(kind)) + ", dz " + c10::toString(dz_dtype) +
                            ", x " + c10::toString(x_dtype);
  EXPECT_LE(relative_error(w_product - start, w_multiplied - start), 1e-5) << label;
  EXPECT_LE(relative_error(*product.state()[0].second, *multiplied.state()[0].second), 1e-5)
      << label;
  // Where no gradient reached (row 0, or the row the index leaves out), nothing moved.
  const int64_t untouched = listed ? 4 : 0;
  EXPECT_TRUE(torch::equal(w_product[untouched], start[untouched])) << label;
}

// Float32 features take the row loop's float32 product, from a float32 or bfloat16 dz; bfloat16
// ones the CPU's bf16 pair products, where it has them.
TEST(ShardOptimizerCpu, RowGradientFormedInTheLoopMatchesTheMultipliedOne) {
  const auto f32 = torch::kFloat32, bf16 = torch::kBFloat16;
  expect_product_matches_multiplied(OptimizerKind::kSgd, f32, f32, RowGradient::kRow, false);
  expect_product_matches_multiplied(OptimizerKind::kSgd, bf16, f32, RowGradient::kUnitRowOverNorm,
                                    true);
  expect_product_matches_multiplied(OptimizerKind::kAdamW, bf16, f32, RowGradient::kUnitRow, false);
  if (!cpu_has_bf16_products()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  expect_product_matches_multiplied(OptimizerKind::kSgd, bf16, bf16, RowGradient::kUnitRowOverNorm,
                                    true);
  expect_product_matches_multiplied(OptimizerKind::kAdamW, bf16, bf16, RowGradient::kRow, false);
}

// bfloat16 features with a float32 logits' gradient (or on a CPU without pair products) have no
// path, and say why.
TEST(ShardOptimizerCpu, Bf16FeaturesNeedPairProducts) {
  OptimizerOptions o;
  ShardOptimizer optimizer(o, 4, 8, torch::kCPU, 0, 1);
  optimizer.begin_step();
  torch::Tensor w = torch::zeros({4, 8});
  const torch::ScalarType dz_dtype = cpu_has_bf16_products() ? torch::kFloat32 : torch::kBFloat16;
  try {
    optimizer.update_rows_from_product(w, torch::Tensor(), 0, 4, torch::zeros({4, 3}, dz_dtype),
                                       torch::zeros({3, 8}, torch::kBFloat16), RowGradient::kRow,
                                       torch::Tensor());
    FAIL() << "bfloat16 features were taken without pair products";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bfloat16 features take the CPU's bf16 pair products"),
              std::string::npos)
        << e.what();
  }
}

TEST(ShardOptimizerCpu, ProductOfTheWrongShapeIsRefused) {
  OptimizerOptions o;
  ShardOptimizer optimizer(o, 4, 8, torch::kCPU, 0, 1);
  optimizer.begin_step();
  torch::Tensor w = torch::zeros({4, 8});
  const torch::Tensor dz = torch::zeros({4, 3});
  try {
    optimizer.update_rows_from_product(w, torch::Tensor(), 0, 4, dz, torch::zeros({3, 7}),
                                       RowGradient::kRow, torch::Tensor());
    FAIL() << "features of the wrong width were taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("features must be contiguous float32 or bfloat16 [B, 8]"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(
      optimizer.update_rows_from_product(w, torch::Tensor(), 0, 4, dz, torch::zeros({2, 8}),
                                         RowGradient::kRow, torch::Tensor()),
      Error);
}

uint16_t bf16_bits(const torch::Tensor& t, int64_t i) {
  uint16_t bits;
  std::memcpy(&bits, static_cast<const char*>(t.data_ptr()) + 2 * i, sizeof bits);
  return bits;
}

// SGD without momentum or decay at lr 0.5 on bfloat16 weights and gradients: w - g/2 is exact in
// float32, so every stored element must be bf16_bits_stochastic of it under the bits of its
// global element, on rows of even and odd width, from even and odd global rows.
TEST(ShardOptimizerCpu, Bf16StoresDrawTheBitsOfTheirGlobalElement) {
  for (const int64_t dim : {64, 41}) {
    for (const int64_t first_row : {0, 7}) {
      OptimizerOptions o;
      o.lr = 0.5;
      o.momentum = 0.0;
      o.weight_decay = 0.0;
      const int64_t rows = 5;
      ShardOptimizer optimizer(o, rows, dim, torch::kCPU, first_row, 11);
      optimizer.begin_step();
      const torch::Tensor start = torch::randn({rows, dim}).to(torch::kBFloat16);
      const torch::Tensor grad = torch::randn({rows, dim}).to(torch::kBFloat16).to(torch::kFloat32);
      torch::Tensor w = start.clone();
      optimizer.update_rows(w, torch::Tensor(), 0, rows, grad, RowGradient::kRow, torch::Tensor());
      const torch::Tensor exact = (start.to(torch::kFloat32) - 0.5 * grad).contiguous();
      const float* e = exact.data_ptr<float>();
      int64_t mismatches = 0;
      for (int64_t i = 0; i < rows * dim; ++i) {
        const uint16_t expected = bf16_bits_stochastic(
            e[i], rounding_bits(optimizer.rounding_seed(), first_row * dim + i));
        mismatches += bf16_bits(w, i) != expected;
      }
      EXPECT_EQ(mismatches, 0) << "D = " << dim << ", first row " << first_row;
    }
  }
}

}  // namespace
}  // namespace myriad
