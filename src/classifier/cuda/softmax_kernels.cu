// Fused per-chunk kernels of the sharded margin softmax: one pass over a chunk's logits for the
// forward statistics, one for the gradient.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "kernels.h"

namespace myriad::cuda {

namespace {

constexpr int kStatsThreads = 256;
constexpr int kGradThreads = 256;

__device__ inline void combine(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  const float mx = fmaxf(m, m2);
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

__global__ void chunk_stats_kernel(const float* __restrict__ dot, int64_t cols,
                                   const int64_t* __restrict__ target_col, int64_t begin,
                                   MarginParams params, float* __restrict__ tile_max,
                                   float* __restrict__ tile_sum, float* __restrict__ target_logit,
                                   int64_t tiles) {
  const int64_t row = blockIdx.x;
  const int64_t tile = blockIdx.y;
  const int64_t start = tile * kStatsTile;
  const int64_t end = min(cols, start + kStatsTile);
  const float* in = dot + row * cols;
  const int64_t target = target_col[row] - begin;
  // Online max and sum of exponentials: one read of each logit.
  float m = -INFINITY;
  float s = 0.0f;
  for (int64_t j = start + threadIdx.x; j < end; j += kStatsThreads) {
    float z;
    if (j == target) {
      float unused;
      margin_target(in[j], params, &z, &unused);
      target_logit[row] = z;
    } else {
      z = margin_other(in[j], params);
    }
    if (z > m) {
      s = s * __expf(m - z) + 1.0f;
      m = z;
    } else {
      s += __expf(z - m);
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    combine(m, s, __shfl_down_sync(0xffffffff, m, offset), __shfl_down_sync(0xffffffff, s, offset));
  }
  __shared__ float warp_m[kStatsThreads / 32];
  __shared__ float warp_s[kStatsThreads / 32];
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) {
    warp_m[warp] = m;
    warp_s[warp] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kStatsThreads / 32; ++w) combine(m, s, warp_m[w], warp_s[w]);
    tile_max[row * tiles + tile] = m;
    tile_sum[row * tiles + tile] = s;
  }
}

__device__ inline void store(float* out, float v) { *out = v; }
__device__ inline void store(__nv_bfloat16* out, float v) { *out = __float2bfloat16(v); }
__device__ inline void store(__half* out, float v) { *out = __float2half(v); }

template <typename Out>
__global__ void chunk_grad_kernel(const float* __restrict__ dot, int64_t cols,
                                  const int64_t* __restrict__ target_col, int64_t begin,
                                  const float* __restrict__ row_max,
                                  const float* __restrict__ row_inv_sum,
                                  const float* __restrict__ coef_ptr, MarginParams params,
                                  Out* __restrict__ out) {
  const int64_t row = blockIdx.y;
  const float mx = row_max[row];
  const float inv_sum = row_inv_sum[row];
  const float coef = *coef_ptr;
  const float other_scale = params.normalized ? params.scale : 1.0f;
  const int64_t target = target_col[row] - begin;
  const float* in = dot + row * cols;
  Out* o = out + row * cols;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(kGradThreads) + threadIdx.x; j < cols;
       j += static_cast<int64_t>(gridDim.x) * kGradThreads) {
    if (j == target) {
      float z, dz_dcos;
      margin_target(in[j], params, &z, &dz_dcos);
      store(o + j, coef * (__expf(z - mx) * inv_sum - 1.0f) * dz_dcos);
    } else {
      const float z = margin_other(in[j], params);
      store(o + j, coef * __expf(z - mx) * inv_sum * other_scale);
    }
  }
}

}  // namespace

cudaError_t chunk_stats(const float* dot, int64_t rows, int64_t cols, const int64_t* target_col,
                        int64_t begin, MarginParams params, float* tile_max, float* tile_sum,
                        float* target_logit, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const int64_t tiles = (cols + kStatsTile - 1) / kStatsTile;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(tiles));
  chunk_stats_kernel<<<grid, kStatsThreads, 0, stream>>>(dot, cols, target_col, begin, params,
                                                         tile_max, tile_sum, target_logit, tiles);
  return cudaGetLastError();
}

cudaError_t chunk_grad(const float* dot, int64_t rows, int64_t cols, const int64_t* target_col,
                       int64_t begin, const float* row_max, const float* row_inv_sum,
                       const float* coef, MarginParams params, void* out, ElementType out_type,
                       cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  // At least 8 elements per thread; rows go to the grid's y dimension.
  const int64_t x_blocks = std::min<int64_t>((cols + kGradThreads * 8 - 1) / (kGradThreads * 8), 65535);
  const dim3 grid(static_cast<unsigned>(x_blocks), static_cast<unsigned>(rows));
  switch (out_type) {
    case ElementType::kFloat32:
      chunk_grad_kernel<<<grid, kGradThreads, 0, stream>>>(dot, cols, target_col, begin, row_max, row_inv_sum,
                                                           coef, params, static_cast<float*>(out));
      break;
    case ElementType::kBFloat16:
      chunk_grad_kernel<<<grid, kGradThreads, 0, stream>>>(dot, cols, target_col, begin, row_max, row_inv_sum,
                                                           coef, params, static_cast<__nv_bfloat16*>(out));
      break;
    case ElementType::kFloat16:
      chunk_grad_kernel<<<grid, kGradThreads, 0, stream>>>(dot, cols, target_col, begin, row_max, row_inv_sum,
                                                           coef, params, static_cast<__half*>(out));
      break;
  }
  return cudaGetLastError();
}

}  // namespace myriad::cuda
