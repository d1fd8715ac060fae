#include "softmax_chunk.h"

#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "cpu_softmax.h"
#include "myriad/classifier/chunk_plan.h"
#include "myriad/util/check_cuda.h"
#include "myriad/util/cpu_clones.h"
#include "myriad/util/device.h"
#include "myriad/util/error.h"
#include "myriad/util/vector_math.h"
#include "row_update_rule.h"

#ifdef MYRIAD_WITH_CUDA
#include <c10/cuda/CUDAStream.h>

#include "cuda/kernels.h"
#endif
#ifdef MYRIAD_WITH_HOPPER_KERNELS
#include <c10/cuda/CUDAGuard.h>

#include "cuda/hopper/fused_softmax.h"
#endif

namespace myriad {

namespace {

// Calls f with a null pointer of the C++ type of `dtype`: float32, bfloat16 or float16.
template <class F>
void with_type(torch::ScalarType dtype, F&& f) {
  switch (dtype) {
    case torch::kBFloat16:
      return f(static_cast<c10::BFloat16*>(nullptr));
    case torch::kFloat16:
      return f(static_cast<c10::Half*>(nullptr));
    case torch::kFloat32:
      return f(static_cast<float*>(nullptr));
    default:
      MYRIAD_THROW("no CPU row kernel for {}", c10::toString(dtype));
  }
}

// Rows [first, last) of cpu_inv_norms; cloned, as the baseline's four-float loop spilled the
// sixteen lanes of row_squares to the stack.
template <typename T>
MYRIAD_CPU_CLONES void inv_norm_range(const T* data, int64_t first, int64_t last, int64_t dim,
                                      float* norms) {
  for (int64_t i = first; i < last; ++i) norms[i] = inverse_norm(row_squares(data + i * dim, dim));
}

// The CPU's prepare_rows and its norms: one pass over each row, as the GPU's row kernels make.
torch::Tensor cpu_inv_norms(const torch::Tensor& rows) {
  torch::Tensor out = torch::empty({rows.size(0)}, rows.options().dtype(torch::kFloat32));
  float* norms = out.data_ptr<float>();
  const torch::Tensor r = rows.contiguous();
  const int64_t dim = r.size(1);
  with_type(r.scalar_type(), [&](auto* tag) {
    const auto* data = r.data_ptr<std::remove_pointer_t<decltype(tag)>>();
    at::parallel_for(0, r.size(0), 1024, [&](int64_t first, int64_t last) {
      inv_norm_range(data, first, last, dim, norms);
    });
  });
  return out;
}

// Rows [first, last) of cpu_prepare_rows, each read once: as the GPU's, w / max(|w|, 1e-12) with
// 1/|w| taken once.
template <typename In, typename Out>
MYRIAD_CPU_CLONES void prepare_row_range(const In* in, const int64_t* rows, int64_t begin,
                                         int64_t first, int64_t last, int64_t dim, bool normalize,
                                         Out* out) {
  for (int64_t i = first; i < last; ++i) {
    const In* row = in + (rows != nullptr ? rows[begin + i] : begin + i) * dim;
    const float scale =
        normalize ? 1.0f / std::max(std::sqrt(row_squares(row, dim)), 1e-12f) : 1.0f;
    Out* o = out + i * dim;
    for (int64_t k = 0; k < dim; ++k) store_rounded(o + k, static_cast<float>(row[k]) * scale);
  }
}

torch::Tensor cpu_prepare_rows(const torch::Tensor& weight, const torch::Tensor& index,
                               int64_t begin, int64_t end, torch::ScalarType dtype,
                               bool normalize) {
  const torch::Tensor w = weight.contiguous();
  const int64_t dim = w.size(1);
  torch::Tensor out = torch::empty({end - begin, dim}, w.options().dtype(dtype));
  // The listed rows stay alive while the loop reads them (a non-contiguous index is copied).
  const torch::Tensor listed = index.defined() ? index.contiguous() : torch::Tensor();
  const int64_t* rows = listed.defined() ? listed.data_ptr<int64_t>() : nullptr;
  with_type(w.scalar_type(), [&](auto* in_tag) {
    with_type(dtype, [&](auto* out_tag) {
      const auto* in = w.data_ptr<std::remove_pointer_t<decltype(in_tag)>>();
      auto* o = out.data_ptr<std::remove_pointer_t<decltype(out_tag)>>();
      at::parallel_for(0, end - begin, 1024, [&](int64_t first, int64_t last) {
        prepare_row_range(in, rows, begin, first, last, dim, normalize, o);
      });
    });
  });
  return out;
}

#ifdef MYRIAD_WITH_CUDA
// An optional float32 argument of a kernel: its data, or null where undefined.
const float* floats_or_null(const torch::Tensor& t) {
  return t.defined() ? t.data_ptr<float>() : nullptr;
}

cudaStream_t stream_of(const torch::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

#endif

}  // namespace

torch::Tensor prepare_chunk_rows(const torch::Tensor& weight, const torch::Tensor& index,
                                 int64_t begin, int64_t end, torch::ScalarType dtype,
                                 bool normalize) {
#ifdef MYRIAD_WITH_CUDA
  if (weight.is_cuda()) {
    const int64_t count = end - begin;
    torch::Tensor out = torch::empty({count, weight.size(1)}, weight.options().dtype(dtype));
    MYRIAD_CHECK_CUDA(cuda::prepare_rows(
        weight.data_ptr(), element_type(weight.scalar_type()), weight.size(1),
        index.defined() ? index.data_ptr<int64_t>() : nullptr, begin, count, normalize,
        out.data_ptr(), element_type(dtype), nullptr, stream_of(weight)));
    return out;
  }
#endif
  return cpu_prepare_rows(weight, index, begin, end, dtype, normalize);
}

torch::Tensor chunk_inv_norms(const torch::Tensor& weight, int64_t begin, int64_t end) {
#ifdef MYRIAD_WITH_CUDA
  if (weight.is_cuda()) {
    torch::Tensor out = torch::empty({end - begin}, weight.options().dtype(torch::kFloat32));
    MYRIAD_CHECK_CUDA(cuda::prepare_rows(weight.data_ptr(), element_type(weight.scalar_type()),
                                         weight.size(1), nullptr, begin, end - begin, false,
                                         nullptr, cuda::ElementType::kFloat32,
                                         out.data_ptr<float>(), stream_of(weight)));
    return out;
  }
#endif
  return cpu_inv_norms(weight.slice(0, begin, end));
}

torch::Tensor logit_bounds(const torch::Tensor& x, const torch::Tensor& inv_norms) {
  MYRIAD_CHECK(inv_norms.numel() > 0 && x.scalar_type() == torch::kFloat32,
               "a bound on the logits needs float32 features and at least one class row");
  return (x.norm(2, 1) * inv_norms.min().reciprocal()).contiguous();
}

namespace {

// Folds per-tile statistics [tiles, B] into the running ones: the chunk's max and sum first,
// then both sums rescaled to the new maximum. tile_max is left as it is (kept exponentials read
// it in backward).
void merge_tile_stats(const torch::Tensor& tile_max, torch::Tensor& tile_sum,
                      torch::Tensor& row_max, torch::Tensor& row_sum) {
  const torch::Tensor chunk_max = std::get<0>(tile_max.max(0));
  const torch::Tensor chunk_sum = tile_sum.mul_((tile_max - chunk_max.unsqueeze(0)).exp_()).sum(0);
  const torch::Tensor merged_max = torch::maximum(row_max, chunk_max);
  row_sum.mul_(row_max.sub_(merged_max).exp_())
      .add_(chunk_sum.mul_(chunk_max.sub_(merged_max).exp_()));
  row_max.copy_(merged_max);
}

}  // namespace

void accumulate_chunk_stats(const torch::Tensor& dot, const torch::Tensor& row_scale,
                            const torch::Tensor& target_col, int64_t begin,
                            const MarginParams& params, torch::Tensor& row_max,
                            torch::Tensor& row_sum, torch::Tensor& target_logit,
                            CpuKeptExponentials* kept) {
  MYRIAD_CHECK(kept == nullptr || !dot.is_cuda(), "only the CPU softmax keeps its exponentials");
  torch::Tensor tile_max, tile_sum;
#ifdef MYRIAD_WITH_CUDA
  if (dot.is_cuda()) {
    const int64_t tile_rows = cuda::softmax_tile_rows(dot.size(0), dot.size(1));
    const int64_t tiles = (dot.size(0) + tile_rows - 1) / tile_rows;
    tile_max = torch::empty({tiles, dot.size(1)}, dot.options());
    tile_sum = torch::empty({tiles, dot.size(1)}, dot.options());
    MYRIAD_CHECK_CUDA(cuda::chunk_stats(
        dot.data_ptr<float>(), floats_or_null(row_scale), dot.size(0), dot.size(1),
        target_col.data_ptr<int64_t>(), begin, params, tile_max.data_ptr<float>(),
        tile_sum.data_ptr<float>(), target_logit.data_ptr<float>(), stream_of(dot)));
  }
#endif
  if (!dot.is_cuda())
    cpu_chunk_stats({dot, row_scale, target_col, begin, params}, tile_max, tile_sum, target_logit,
                    kept);
  merge_tile_stats(tile_max, tile_sum, row_max, row_sum);
}

torch::Tensor chunk_logit_grad(const torch::Tensor& dot, const torch::Tensor& row_scale,
                               const torch::Tensor& target_col, int64_t begin,
                               const torch::Tensor& row_max, const torch::Tensor& row_inv_sum,
                               const torch::Tensor& coef, const MarginParams& params,
                               torch::ScalarType dtype) {
#ifdef MYRIAD_WITH_CUDA
  if (dot.is_cuda()) {
    torch::Tensor out = torch::empty(dot.sizes(), dot.options().dtype(dtype));
    MYRIAD_CHECK_CUDA(
        cuda::chunk_grad(dot.data_ptr<float>(), floats_or_null(row_scale), dot.size(0), dot.size(1),
                         target_col.data_ptr<int64_t>(), begin, row_max.data_ptr<float>(),
                         row_inv_sum.data_ptr<float>(), coef.data_ptr<float>(), params,
                         out.data_ptr(), element_type(dtype), stream_of(dot)));
    return out;
  }
#endif
  return cpu_chunk_grad({dot, row_scale, target_col, begin, params}, row_max, row_inv_sum,
                        coef.item<float>(), dtype);
}

bool fused_chunks_apply(const torch::Device& device, int64_t dim, torch::ScalarType gemm_dtype) {
#ifdef MYRIAD_WITH_HOPPER_KERNELS
  return device.is_cuda() && fused_kernels_take(gemm_dtype, dim) &&
         cuda::fused_softmax_runs_on(device.index() < 0 ? 0 : device.index());
#else
  (void)device, (void)dim, (void)gemm_dtype;
  return false;
#endif
}

#ifdef MYRIAD_WITH_HOPPER_KERNELS
namespace {

// Checks the operands and makes x's device current: the part count and the launch both read it.
c10::cuda::CUDAGuard prepare_fused_launch(const torch::Tensor& x, const torch::Tensor& rows) {
  MYRIAD_CHECK(x.scalar_type() == torch::kBFloat16 && rows.scalar_type() == torch::kBFloat16 &&
                   x.is_contiguous() && rows.is_contiguous() && x.size(1) == rows.size(1),
               "the fused classifier kernels take contiguous bfloat16 operands of one width");
  return c10::cuda::CUDAGuard(x.device());
}

}  // namespace
#endif

void accumulate_fused_chunk_stats(const torch::Tensor& x, const torch::Tensor& rows,
                                  const torch::Tensor& row_scale, const torch::Tensor& target_col,
                                  int64_t begin, const MarginParams& params, torch::Tensor& row_max,
                                  torch::Tensor& row_sum, torch::Tensor& target_logit,
                                  KeptExponentials* kept) {
#ifdef MYRIAD_WITH_HOPPER_KERNELS
  const auto on_device = prepare_fused_launch(x, rows);
  if (x.size(0) == 0 || rows.size(0) == 0) return;  // nothing to fold in
  const auto f32 = x.options().dtype(torch::kFloat32);
  const int parts = cuda::fused_logit_parts(x.device().index(), x.size(0), rows.size(0));
  torch::Tensor part_max = torch::empty({parts, x.size(0)}, f32);
  torch::Tensor part_sum = torch::empty({parts, x.size(0)}, f32);
  if (kept != nullptr) {
    MYRIAD_CHECK(kept->matrix.scalar_type() == torch::kBFloat16 && kept->matrix.is_contiguous() &&
                     kept->matrix.sizes() == torch::IntArrayRef({rows.size(0), x.size(0)}) &&
                     kept->target_cos.numel() == x.size(0) && kept->reference.defined() &&
                     kept->reference.scalar_type() == torch::kFloat32 &&
                     kept->reference.is_contiguous() && kept->reference.numel() == x.size(0),
                 "the kept exponentials take a contiguous bfloat16 [classes, batch] matrix and a "
                 "float32 [batch] reference");
  }
  MYRIAD_CHECK_CUDA(cuda::fused_logit_stats(
      x.data_ptr(), x.size(0), rows.data_ptr(), floats_or_null(row_scale), rows.size(0),
      static_cast<int>(x.size(1)), target_col.data_ptr<int64_t>(), begin, params,
      part_max.data_ptr<float>(), part_sum.data_ptr<float>(), target_logit.data_ptr<float>(),
      kept != nullptr ? kept->target_cos.data_ptr<float>() : nullptr,
      kept != nullptr ? kept->matrix.data_ptr() : nullptr,
      kept != nullptr ? kept->reference.data_ptr<float>() : nullptr, stream_of(x)));
  merge_tile_stats(part_max, part_sum, row_max, row_sum);
#else
  (void)x, (void)rows, (void)row_scale, (void)target_col, (void)begin, (void)params, (void)row_max,
      (void)row_sum, (void)target_logit, (void)kept;
  MYRIAD_THROW("this build has no fused classifier kernels");
#endif
}

#ifdef MYRIAD_WITH_HOPPER_KERNELS
namespace {

// The fused gradient kernel into `out` [rows, B] bfloat16, gated on `gate` where defined.
void launch_logit_grad(const torch::Tensor& x, const torch::Tensor& rows,
                       const torch::Tensor& row_scale, const torch::Tensor& target_col,
                       int64_t begin, const torch::Tensor& row_max,
                       const torch::Tensor& row_inv_sum, const torch::Tensor& coef,
                       const MarginParams& params, torch::Tensor& out, const torch::Tensor& gate) {
  MYRIAD_CHECK_CUDA(cuda::fused_logit_grad(
      x.data_ptr(), x.size(0), rows.data_ptr(), floats_or_null(row_scale), rows.size(0),
      static_cast<int>(x.size(1)), target_col.data_ptr<int64_t>(), begin, row_max.data_ptr<float>(),
      row_inv_sum.data_ptr<float>(), coef.data_ptr<float>(), params, out.data_ptr(),
      gate.defined() ? gate.data_ptr<int>() : nullptr, stream_of(x)));
}

}  // namespace
#endif

torch::Tensor finish_kept_exponentials(KeptExponentials& kept, const torch::Tensor& x,
                                       const torch::Tensor& rows, const torch::Tensor& row_scale,
                                       const torch::Tensor& target_col, int64_t begin,
                                       const torch::Tensor& row_max,
                                       const torch::Tensor& row_inv_sum, const torch::Tensor& coef,
                                       const MarginParams& params) {
#ifdef MYRIAD_WITH_HOPPER_KERNELS
  const auto on_device = prepare_fused_launch(x, rows);
  MYRIAD_CHECK(kept.matrix.sizes() == torch::IntArrayRef({rows.size(0), x.size(0)}) &&
                   kept.reference.defined() && kept.reference.numel() == x.size(0),
               "the kept exponentials are [{}, {}] with references [{}], not the chunk's [{}, {}] "
               "and [{}]",
               kept.matrix.size(0), kept.matrix.size(1),
               kept.reference.defined() ? kept.reference.numel() : 0, rows.size(0), x.size(0),
               x.size(0));
  const int64_t batch = x.size(0);
  torch::Tensor factor = torch::empty({batch}, row_max.options());
  const torch::Tensor deep = torch::empty({1}, row_max.options().dtype(torch::kInt32));
  MYRIAD_CHECK_CUDA(
      cuda::kept_finish(kept.matrix.data_ptr(), batch, rows.size(0), floats_or_null(row_scale),
                        target_col.data_ptr<int64_t>(), begin, kept.target_cos.data_ptr<float>(),
                        row_max.data_ptr<float>(), row_inv_sum.data_ptr<float>(),
                        coef.data_ptr<float>(), kept.reference.data_ptr<float>(), params,
                        factor.data_ptr<float>(), deep.data_ptr<int>(), stream_of(x)));
  // Deep rows (decided on the device): the logits' gradient recomputed over the kept matrix.
  launch_logit_grad(x, rows, row_scale, target_col, begin, row_max, row_inv_sum, coef, params,
                    kept.matrix, deep);
  return factor;
#else
  (void)kept, (void)x, (void)rows, (void)row_scale, (void)target_col, (void)begin, (void)row_max,
      (void)row_inv_sum, (void)coef, (void)params;
  MYRIAD_THROW("this build has no fused classifier kernels");
#endif
}

torch::Tensor fused_chunk_logit_grad(const torch::Tensor& x, const torch::Tensor& rows,
                                     const torch::Tensor& row_scale,
                                     const torch::Tensor& target_col, int64_t begin,
                                     const torch::Tensor& row_max, const torch::Tensor& row_inv_sum,
                                     const torch::Tensor& coef, const MarginParams& params) {
#ifdef MYRIAD_WITH_HOPPER_KERNELS
  const auto on_device = prepare_fused_launch(x, rows);
  torch::Tensor out = torch::empty({rows.size(0), x.size(0)}, x.options());
  launch_logit_grad(x, rows, row_scale, target_col, begin, row_max, row_inv_sum, coef, params, out,
                    torch::Tensor());
  return out;
#else
  (void)x, (void)rows, (void)row_scale, (void)target_col, (void)begin, (void)row_max,
      (void)row_inv_sum, (void)coef, (void)params;
  MYRIAD_THROW("this build has no fused classifier kernels");
#endif
}

}  // namespace myriad
