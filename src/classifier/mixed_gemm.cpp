#include "myriad/classifier/mixed_gemm.h"

#include <algorithm>

#include "cpu_bf16_products.h"
#include "myriad/util/error.h"

#ifdef MYRIAD_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <cublas_v2.h>
#endif

namespace myriad {

namespace {

// `out` is float32, or bfloat16 where `narrow_out` allows it and the operands are bfloat16 (cuBLAS
// writes bfloat16 only from bfloat16 operands; the CPU path, which would take any, keeps the rule).
void check_operands(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b,
                    bool narrow_out) {
  MYRIAD_CHECK(a.scalar_type() == b.scalar_type(), "GEMM operands differ in dtype: {} and {}",
               c10::toString(a.scalar_type()), c10::toString(b.scalar_type()));
  const bool bf16_out = narrow_out && a.scalar_type() == torch::kBFloat16;
  MYRIAD_CHECK((out.scalar_type() == torch::kFloat32 ||
                (bf16_out && out.scalar_type() == torch::kBFloat16)) &&
                   out.is_contiguous(),
               "GEMM output must be contiguous float32{}, not {}", bf16_out ? " or bfloat16" : "",
               c10::toString(out.scalar_type()));
  MYRIAD_CHECK(a.is_contiguous() && b.is_contiguous(), "GEMM operands must be contiguous");
  MYRIAD_CHECK(a.dim() == 2 && b.dim() == 2 && out.dim() == 2, "GEMM operands must be matrices");
}

// out (+)= left @ right in float32, written in out's dtype.
void mm_into(torch::Tensor out, const torch::Tensor& left, const torch::Tensor& right,
             bool accumulate) {
  if (out.scalar_type() != torch::kFloat32) {
    out.copy_(accumulate ? torch::addmm(out.to(torch::kFloat32), left, right)
                         : torch::mm(left, right));
  } else if (accumulate) {
    out.addmm_(left, right);
  } else {
    torch::mm_out(out, left, right);
  }
}

// Rows of a reduced-precision operand converted to float32 at a time on the CPU: about 1 MiB of
// them at D = 64, which stays in cache between its conversion and its product, where converting a
// shard's operand whole wrote and read back twice its size at every call.
constexpr int64_t kCpuBlockRows = 4096;

// On the CPU a product of bfloat16 operands with float32 output runs on the CPU's bf16 pair
// products where it has them, in the two shapes a shard's step takes (the logits, written whole,
// and the long reduction over the classes); otherwise, and for float16, it is float32 arithmetic
// on the operands' values.
// With `a` untransposed the blocks are rows of `a` and of `out`; transposed (the long reduction
// over the classes), they are slices of the reduction, whose partial products `out` sums.
void gemm_cpu(torch::Tensor& out, const torch::Tensor& a, bool trans_a, const torch::Tensor& b,
              bool trans_b, bool accumulate) {
  if (cpu_pair_products(a.scalar_type()) && out.scalar_type() == torch::kFloat32) {
    const auto* pa = a.data_ptr<c10::BFloat16>();
    const auto* pb = b.data_ptr<c10::BFloat16>();
    if (!trans_a && trans_b && !accumulate) {
      return bf16_rows_by_batch(out.data_ptr<float>(), pa, pb, a.size(0), b.size(0), a.size(1));
    }
    if (trans_a && !trans_b) {
      return bf16_long_k(out.data_ptr<float>(), pa, pb, a.size(0), a.size(1), b.size(1),
                         accumulate);
    }
  }
  const auto f32 = [](const torch::Tensor& t) { return t.to(torch::kFloat32); };
  const int64_t rows = a.size(0);
  if (a.scalar_type() == torch::kFloat32 || rows <= kCpuBlockRows || (trans_a && trans_b)) {
    const torch::Tensor left = trans_a ? f32(a).t() : f32(a);
    return mm_into(out, left, trans_b ? f32(b).t() : f32(b), accumulate);
  }
  if (!trans_a) {
    const torch::Tensor right = trans_b ? f32(b).t() : f32(b);
    for (int64_t i = 0; i < rows; i += kCpuBlockRows) {
      const int64_t end = std::min(i + kCpuBlockRows, rows);
      mm_into(out.slice(0, i, end), f32(a.slice(0, i, end)), right, accumulate);
    }
    return;
  }
  torch::Tensor sum =
      accumulate ? f32(out) : torch::zeros(out.sizes(), out.options().dtype(torch::kFloat32));
  for (int64_t i = 0; i < rows; i += kCpuBlockRows) {
    const int64_t end = std::min(i + kCpuBlockRows, rows);
    sum.addmm_(f32(a.slice(0, i, end)).t(), f32(b.slice(0, i, end)));
  }
  if (!sum.is_same(out)) out.copy_(sum);
}

#ifdef MYRIAD_WITH_CUDA
cudaDataType_t cuda_type(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32:
      return CUDA_R_32F;
    case torch::kBFloat16:
      return CUDA_R_16BF;
    case torch::kFloat16:
      return CUDA_R_16F;
    default:
      MYRIAD_THROW("no mixed-precision GEMM for {}", c10::toString(dtype));
  }
}

void check_cublas(cublasStatus_t status, const char* what) {
  MYRIAD_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLAS {} failed: {}", what,
               cublasGetStatusString(status));
}

// A row-major operand as cuBLAS sees it: the same memory read column-major is its transpose.
struct Operand {
  const void* data;
  cublasOperation_t op;
  int64_t ld;
};

// Row-major C[M,N] = op(A)[M,K] op(B)[K,N] is column-major C^T = op(B)^T op(A)^T, so B goes first.
void gemm_cuda(void* c, int64_t m, int64_t n, int64_t k, Operand a, Operand b, cudaDataType_t type,
               float beta, int64_t batch, int64_t stride_a, int64_t stride_b, int64_t stride_c,
               cudaDataType_t c_type = CUDA_R_32F) {
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  const float alpha = 1.0f;
  MYRIAD_CHECK(m <= INT32_MAX && n <= INT32_MAX && k <= INT32_MAX, "GEMM dimensions exceed cuBLAS");
  if (batch == 1) {
    check_cublas(cublasGemmEx(handle, b.op, a.op, static_cast<int>(n), static_cast<int>(m),
                              static_cast<int>(k), &alpha, b.data, type, static_cast<int>(b.ld),
                              a.data, type, static_cast<int>(a.ld), &beta, c, c_type,
                              static_cast<int>(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
  } else {
    check_cublas(
        cublasGemmStridedBatchedEx(
            handle, b.op, a.op, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
            &alpha, b.data, type, static_cast<int>(b.ld), stride_b, a.data, type,
            static_cast<int>(a.ld), stride_a, &beta, c, c_type, static_cast<int>(n), stride_c,
            static_cast<int>(batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
  }
}

// op(X) of a row-major matrix stored as `x`: cuBLAS transposes it iff we do not.
Operand operand(const torch::Tensor& x, bool trans) {
  return {x.data_ptr(), trans ? CUBLAS_OP_T : CUBLAS_OP_N, x.size(1)};
}
#endif

}  // namespace

void gemm_f32(torch::Tensor& out, const torch::Tensor& a, bool trans_a, const torch::Tensor& b,
              bool trans_b, bool accumulate) {
  check_operands(out, a, b, /*narrow_out=*/true);
  const int64_t m = trans_a ? a.size(1) : a.size(0);
  const int64_t k = trans_a ? a.size(0) : a.size(1);
  const int64_t n = trans_b ? b.size(0) : b.size(1);
  MYRIAD_CHECK((trans_b ? b.size(1) : b.size(0)) == k && out.size(0) == m && out.size(1) == n,
               "GEMM shapes do not match: op(a) {}x{}, op(b) {}x{}, out {}x{}", m, k,
               trans_b ? b.size(1) : b.size(0), n, out.size(0), out.size(1));
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (!accumulate) out.zero_();
    return;
  }
  if (!out.is_cuda()) return gemm_cpu(out, a, trans_a, b, trans_b, accumulate);
#ifdef MYRIAD_WITH_CUDA
  gemm_cuda(out.data_ptr(), m, n, k, operand(a, trans_a), operand(b, trans_b),
            cuda_type(a.scalar_type()), accumulate ? 1.0f : 0.0f, 1, 0, 0, 0,
            cuda_type(out.scalar_type()));
#endif
}

void gemm_f32_long_k(torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b,
                     bool accumulate) {
  check_operands(out, a, b, /*narrow_out=*/false);
  const int64_t k = a.size(0), m = a.size(1), n = b.size(1);
  MYRIAD_CHECK(b.size(0) == k && out.size(0) == m && out.size(1) == n, "GEMM shapes do not match");
  // Slices of at least 2048 along K, at most 64 of them: enough output tiles to fill the GPU,
  // few enough partial products to sum cheaply.
  const int64_t slice = std::max<int64_t>(2048, (k + 63) / 64);
  const int64_t slices = k / slice;
  if (!out.is_cuda() || slices < 2) return gemm_f32(out, a, true, b, false, accumulate);
#ifdef MYRIAD_WITH_CUDA
  const cudaDataType_t type = cuda_type(a.scalar_type());
  torch::Tensor partial = torch::empty({slices, m, n}, out.options());
  gemm_cuda(partial.data_ptr(), m, n, slice, Operand{a.data_ptr(), CUBLAS_OP_T, m},
            Operand{b.data_ptr(), CUBLAS_OP_N, n}, type, 0.0f, slices, slice * m, slice * n, m * n);
  if (accumulate) {
    out.add_(partial.sum(0));
  } else {
    torch::sum_out(out, partial, {0});
  }
  const int64_t done = slices * slice;
  if (done < k) {
    const auto* a_rest = static_cast<const char*>(a.data_ptr()) + done * m * a.element_size();
    const auto* b_rest = static_cast<const char*>(b.data_ptr()) + done * n * b.element_size();
    gemm_cuda(out.data_ptr(), m, n, k - done, Operand{a_rest, CUBLAS_OP_T, m},
              Operand{b_rest, CUBLAS_OP_N, n}, type, 1.0f, 1, 0, 0, 0);
  }
#endif
}

}  // namespace myriad
