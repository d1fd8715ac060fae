#include "myriad/classifier/mixed_gemm.h"

#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <cmath>
#include <tuple>

#include "classifier/cpu_bf16_products.h"
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

// Whether float32 `out` is the exact product within float32's error in summing `length` products
// (each exact: two bf16 significands fit in float32's) whose magnitudes sum to `terms`.
bool summed_in_float32(const torch::Tensor& out, const torch::Tensor& exact,
                       const torch::Tensor& terms, int64_t length) {
  const torch::Tensor error = (out.to(torch::kFloat64) - exact).abs();
  return (error <= terms * (static_cast<double>(length) * std::ldexp(1.0, -24)) + 1e-30)
      .all()
      .item<bool>();
}

torch::Tensor bf16_randn(std::initializer_list<int64_t> sizes) {
  return torch::randn(sizes).to(torch::kBFloat16);
}

torch::Tensor f64(const torch::Tensor& t) {
  return t.to(torch::kFloat64);
}

// The shard's two long products from bf16 operands, through gemm_f32 on whichever path this CPU
// takes, at shapes off every block size (8 rows, 16 samples, pairs of the dimension, chunks of
// classes), accumulating or not.
TEST(MixedGemm, BFloat16ProductsOnTheCpuSumInFloat32) {
  torch::manual_seed(5);
  for (const auto& [rows, batch, dim] : {std::tuple<int64_t, int64_t, int64_t>{1003, 21, 83},
                                         {4099, 16, 64},
                                         {7, 37, 2},
                                         {300, 1, 1}}) {
    const torch::Tensor a = bf16_randn({rows, dim}), b = bf16_randn({batch, dim});
    const torch::Tensor exact = f64(a).mm(f64(b).t()), terms = f64(a).abs().mm(f64(b).abs().t());
    torch::Tensor out = torch::empty({rows, batch});
    gemm_f32(out, a, false, b, true, false);
    EXPECT_TRUE(summed_in_float32(out, exact, terms, dim)) << rows << "x" << batch << "x" << dim;
    const torch::Tensor before = torch::randn({rows, batch});
    out = before.clone();
    gemm_f32(out, a, false, b, true, true);
    EXPECT_TRUE(summed_in_float32(out, f64(before) + exact, f64(before).abs() + terms, dim + 1));

    // The features' gradient: the logits' gradient [rows, batch] against the rows, over the rows.
    const torch::Tensor g = bf16_randn({rows, batch});
    const torch::Tensor dx = f64(g).t().mm(f64(a)), dx_terms = f64(g).abs().t().mm(f64(a).abs());
    torch::Tensor sum = torch::randn({batch, dim});
    const torch::Tensor start = sum.clone();
    gemm_f32_long_k(sum, g, a, true);
    EXPECT_TRUE(summed_in_float32(sum, f64(start) + dx, f64(start).abs() + dx_terms, rows + 1))
        << rows << "x" << batch << "x" << dim;
  }
}

// The pair products themselves, where this CPU has them: the same bounds at several thread
// counts, and the same bits on a second run at each.
TEST(CpuBf16Products, SumInFloat32AndRepeatBitForBit) {
  if (!cpu_has_bf16_products()) GTEST_SKIP() << "this CPU has no AVX512-BF16";
  torch::manual_seed(8);
  const int threads = at::get_num_threads();
  const int64_t rows = 20011, batch = 33, dim = 65;
  const torch::Tensor a = bf16_randn({rows, dim}), b = bf16_randn({batch, dim});
  const torch::Tensor g = bf16_randn({rows, batch});
  const torch::Tensor dx = f64(g).t().mm(f64(a)), dx_terms = f64(g).abs().t().mm(f64(a).abs());
  const torch::Tensor z = f64(a).mm(f64(b).t()), z_terms = f64(a).abs().mm(f64(b).abs().t());
  const auto run = [&](torch::Tensor& logits, torch::Tensor& grad) {
    logits = torch::empty({rows, batch});
    grad = torch::empty({batch, dim});
    bf16_rows_by_batch(logits.data_ptr<float>(), a.data_ptr<c10::BFloat16>(),
                       b.data_ptr<c10::BFloat16>(), rows, batch, dim);
    bf16_long_k(grad.data_ptr<float>(), g.data_ptr<c10::BFloat16>(), a.data_ptr<c10::BFloat16>(),
                rows, batch, dim, false);
  };
  for (const int t : {1, 3}) {
    at::set_num_threads(t);
    torch::Tensor logits, grad, logits2, grad2;
    run(logits, grad);
    run(logits2, grad2);
    EXPECT_TRUE(summed_in_float32(logits, z, z_terms, dim)) << t << " threads";
    EXPECT_TRUE(summed_in_float32(grad, dx, dx_terms, rows)) << t << " threads";
    EXPECT_TRUE(torch::equal(logits, logits2) && torch::equal(grad, grad2)) << t << " threads";
  }
  at::set_num_threads(threads);
}

}  // namespace
}  // namespace myriad
