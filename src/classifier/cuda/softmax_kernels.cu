// Fused per-chunk kernels of the sharded margin softmax over class-major logits [classes, batch]:
// one pass for the forward statistics, one for the gradient. Each thread owns one sample
// (column) and walks a tile of classes, so a warp reads 32 consecutive floats per row.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "kernels.h"

namespace myriad::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr int64_t kGradTileRows = 256;

__device__ inline float logit(float cosine, int64_t j, int64_t target, const MarginParams& params,
                              float* dz_dcos) {
  if (j == target) {
    float z;
    margin_target(cosine, params, &z, dz_dcos);
    return z;
  }
  *dz_dcos = params.normalized ? params.scale : 1.0f;
  return margin_other(cosine, params);
}

__global__ void chunk_stats_kernel(const float* __restrict__ dot, int64_t classes, int64_t batch,
                                   const int64_t* __restrict__ target_col, int64_t begin,
                                   MarginParams params, float* __restrict__ tile_max,
                                   float* __restrict__ tile_sum, float* __restrict__ target_logit) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (b >= batch) return;
  const int64_t target = target_col[b] - begin;
  const int64_t tiles = (classes + kStatsTileRows - 1) / kStatsTileRows;
  for (int64_t tile = blockIdx.y; tile < tiles; tile += gridDim.y) {
    const int64_t first = tile * kStatsTileRows;
    const int64_t last = min(classes, first + kStatsTileRows);
    // Online max and sum of exponentials over the tile's classes; loads are issued kUnroll at a
    // time so several are in flight per thread.
    float m = -INFINITY, s = 0.0f;
    for (int64_t j = first; j < last; j += kUnroll) {
      float values[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        values[u] = j + u < last ? dot[(j + u) * batch + b] : -INFINITY;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (j + u >= last) continue;
        float unused;
        const float z = logit(values[u], j + u, target, params, &unused);
        if (j + u == target) target_logit[b] = z;
        if (z > m) {
          s = s * __expf(m - z) + 1.0f;
          m = z;
        } else {
          s += __expf(z - m);
        }
      }
    }
    tile_max[tile * batch + b] = m;
    tile_sum[tile * batch + b] = s;
  }
}

__device__ inline void store(float* out, float v) {
  *out = v;
}
__device__ inline void store(__nv_bfloat16* out, float v) {
  *out = __float2bfloat16(v);
}
__device__ inline void store(__half* out, float v) {
  *out = __float2half(v);
}

template <typename Out>
__global__ void chunk_grad_kernel(const float* __restrict__ dot, int64_t classes, int64_t batch,
                                  const int64_t* __restrict__ target_col, int64_t begin,
                                  const float* __restrict__ row_max,
                                  const float* __restrict__ row_inv_sum,
                                  const float* __restrict__ coef_ptr, MarginParams params,
                                  Out* __restrict__ out) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (b >= batch) return;
  const float mx = row_max[b];
  const float inv_sum = row_inv_sum[b];
  const float coef = *coef_ptr;
  const int64_t target = target_col[b] - begin;
  const int64_t tiles = (classes + kGradTileRows - 1) / kGradTileRows;
  for (int64_t tile = blockIdx.y; tile < tiles; tile += gridDim.y) {
    const int64_t first = tile * kGradTileRows;
    const int64_t last = min(classes, first + kGradTileRows);
    for (int64_t j = first; j < last; j += kUnroll) {
      float values[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) values[u] = j + u < last ? dot[(j + u) * batch + b] : 0.0f;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (j + u >= last) continue;
        float dz_dcos;
        const float z = logit(values[u], j + u, target, params, &dz_dcos);
        const float p = __expf(z - mx) * inv_sum - (j + u == target ? 1.0f : 0.0f);
        store(out + (j + u) * batch + b, coef * p * dz_dcos);
      }
    }
  }
}

// Samples across x; tiles of classes across y, grid-strided beyond the grid's y limit.
dim3 grid_for(int64_t classes, int64_t batch, int64_t tile_rows) {
  const int64_t tiles = (classes + tile_rows - 1) / tile_rows;
  return dim3(static_cast<unsigned>((batch + kThreads - 1) / kThreads),
              static_cast<unsigned>(std::min<int64_t>(tiles, 65535)));
}

}  // namespace

cudaError_t chunk_stats(const float* dot, int64_t classes, int64_t batch, const int64_t* target_col,
                        int64_t begin, MarginParams params, float* tile_max, float* tile_sum,
                        float* target_logit, cudaStream_t stream) {
  if (classes == 0 || batch == 0) return cudaSuccess;
  chunk_stats_kernel<<<grid_for(classes, batch, kStatsTileRows), kThreads, 0, stream>>>(
      dot, classes, batch, target_col, begin, params, tile_max, tile_sum, target_logit);
  return cudaGetLastError();
}

cudaError_t chunk_grad(const float* dot, int64_t classes, int64_t batch, const int64_t* target_col,
                       int64_t begin, const float* row_max, const float* row_inv_sum,
                       const float* coef, MarginParams params, void* out, ElementType out_type,
                       cudaStream_t stream) {
  if (classes == 0 || batch == 0) return cudaSuccess;
  const dim3 grid = grid_for(classes, batch, kGradTileRows);
  switch (out_type) {
    case ElementType::kFloat32:
      chunk_grad_kernel<<<grid, kThreads, 0, stream>>>(dot, classes, batch, target_col, begin,
                                                       row_max, row_inv_sum, coef, params,
                                                       static_cast<float*>(out));
      break;
    case ElementType::kBFloat16:
      chunk_grad_kernel<<<grid, kThreads, 0, stream>>>(dot, classes, batch, target_col, begin,
                                                       row_max, row_inv_sum, coef, params,
                                                       static_cast<__nv_bfloat16*>(out));
      break;
    case ElementType::kFloat16:
      chunk_grad_kernel<<<grid, kThreads, 0, stream>>>(dot, classes, batch, target_col, begin,
                                                       row_max, row_inv_sum, coef, params,
                                                       static_cast<__half*>(out));
      break;
  }
  return cudaGetLastError();
}

}  // namespace myriad::cuda
