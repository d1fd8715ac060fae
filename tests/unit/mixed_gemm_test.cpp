#include "myriad/classifier/mixed_gemm.h"

#include <gtest/gtest.h>

#include <cmath>

#include "myriad/util/error.h"

namespace myriad {
namespace {

// Whether every element of `out` (bf16) lies within rounding to nearest of `exact`: half a bf16
// step, at most 2^-8 of the value, where truncating could take a whole step; plus float32's error
// in summing `terms` (the sums of the products' magnitudes), which cancellation leaves near zero.
bool rounded_once(const torch::Tensor& out, const torch::Tensor& exact,
                  const torch::Tensor& terms) {
  const torch::Tensor error = (out.to(torch::kFloat64) - exact).abs();
  const torch::Tensor sum_error = terms * 64 * std::ldexp(1.0, -24);
  return (error <= (exact.abs() + sum_error) * (1.0 / 256) + sum_error).all().item<bool>();
}

// The rows' gradient of bf16 rows (row_gradient_store): the float32 sums rounded to bf16, the
// product added to what `out` holds when accumulating.
TEST(MixedGemm, BFloat16OutputRoundsTheSumsOnce) {
  torch::manual_seed(3);
  const torch::Tensor a = torch::randn({24, 40}).to(torch::kBFloat16);
  const torch::Tensor b = torch::randn({40, 16}).to(torch::kBFloat16);
  const torch::Tensor product = a.to(torch::kFloat64).mm(b.to(torch::kFloat64));
  const torch::Tensor terms = a.to(torch::kFloat64).abs().mm(b.to(torch::kFloat64).abs());
  torch::Tensor out = torch::empty({24, 16}, torch::kBFloat16);
  gemm_f32(out, a, false, b, false, false);
  EXPECT_TRUE(rounded_once(out, product, terms));
  const torch::Tensor before = torch::randn({24, 16}).to(torch::kBFloat16);
  out = before.clone();
  gemm_f32(out, a.t().contiguous(), true, b, false, true);
  EXPECT_TRUE(rounded_once(out, before.to(torch::kFloat64) + product,
                           before.to(torch::kFloat64).abs() + terms));
}

// cuBLAS writes bf16 only from bf16 operands; the CPU path keeps the same rule, so that CI finds
// a caller that breaks it.
TEST(MixedGemm, BFloat16OutputTakesBFloat16OperandsOnly) {
  torch::Tensor out = torch::empty({4, 4}, torch::kBFloat16);
  const torch::Tensor f = torch::ones({4, 4});
  EXPECT_THROW(gemm_f32(out, f, false, f, false, false), Error);
  const torch::Tensor h = torch::ones({4, 4}, torch::kFloat16);
  EXPECT_THROW(gemm_f32(out, h, false, h, false, false), Error);
  const torch::Tensor k = torch::ones({4096, 4}, torch::kBFloat16);
  EXPECT_THROW(gemm_f32_long_k(out, k, k, false), Error);
}

}  // namespace
}  // namespace myriad
