// Fused per-chunk kernels of the sharded margin softmax over class-major logits [classes, batch]:
// one pass for the forward statistics, one for the gradient. Each thread owns kVector adjacent
// samples (columns) and walks a tile of classes; a warp reads 32 * kVector consecutive floats of
// each class row with 16-byte loads when the batch allows it.

#include <algorithm>
#include <cmath>

#include "kernels.h"
#include "myriad/util/cuda_elements.cuh"

namespace myriad::cuda {

namespace {

constexpr int kMaxThreads = 256;
constexpr int kUnroll = 4;

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

// kVector consecutive floats of one class row, read as one access.
template <int kVector>
__device__ inline Pack<float, kVector> load_columns(const float* p) {
  return *reinterpret_cast<const Pack<float, kVector>*>(p);
}

// kVector floats stored as one access into a row of float32, bfloat16 or float16.
template <int kVector, typename T>
__device__ inline void store_columns(T* out, const float* v) {
  Pack<T, kVector> pack;
#pragma unroll
  for (int j = 0; j < kVector; ++j) pack.e[j] = from_float<T>(v[j]);
  *reinterpret_cast<Pack<T, kVector>*>(out) = pack;
}

template <int kVector>
__global__ void chunk_stats_kernel(const float* __restrict__ dot,
                                   const float* __restrict__ row_scale, int64_t classes,
                                   int64_t batch, const int64_t* __restrict__ target_col,
                                   int64_t begin, MarginParams params, int64_t tile_rows,
                                   float* __restrict__ tile_max, float* __restrict__ tile_sum,
                                   float* __restrict__ target_logit) {
  const int64_t b0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVector;
  if (b0 >= batch) return;
  int64_t target[kVector];
#pragma unroll
  for (int v = 0; v < kVector; ++v) target[v] = target_col[b0 + v] - begin;
  const int64_t tiles = (classes + tile_rows - 1) / tile_rows;
  for (int64_t tile = blockIdx.y; tile < tiles; tile += gridDim.y) {
    const int64_t first = tile * tile_rows;
    const int64_t last = min(classes, first + tile_rows);
    // Online max and sum of exponentials over the tile's classes; kUnroll rows of loads are in
    // flight per thread.
    float m[kVector], s[kVector];
#pragma unroll
    for (int v = 0; v < kVector; ++v) m[v] = -INFINITY, s[v] = 0.0f;
    for (int64_t j = first; j < last; j += kUnroll) {
      Pack<float, kVector> rows[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (j + u < last) rows[u] = load_columns<kVector>(dot + (j + u) * batch + b0);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (j + u >= last) continue;
        const float scale = row_scale != nullptr ? row_scale[j + u] : 1.0f;
#pragma unroll
        for (int v = 0; v < kVector; ++v) {
          float unused;
          const float z = logit(rows[u].e[v] * scale, j + u, target[v], params, &unused);
          if (j + u == target[v]) target_logit[b0 + v] = z;
          if (z > m[v]) {
            s[v] = s[v] * __expf(m[v] - z) + 1.0f;
            m[v] = z;
          } else {
            s[v] += __expf(z - m[v]);
          }
        }
      }
    }
    float* out_max = tile_max + tile * batch + b0;
    float* out_sum = tile_sum + tile * batch + b0;
    store_columns<kVector>(out_max, m);
    store_columns<kVector>(out_sum, s);
  }
}

template <int kVector, typename Out>
__global__ void chunk_grad_kernel(const float* __restrict__ dot,
                                  const float* __restrict__ row_scale, int64_t classes,
                                  int64_t batch, const int64_t* __restrict__ target_col,
                                  int64_t begin, const float* __restrict__ row_max,
                                  const float* __restrict__ row_inv_sum,
                                  const float* __restrict__ coef_ptr, MarginParams params,
                                  int64_t tile_rows, Out* __restrict__ out) {
  const int64_t b0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kVector;
  if (b0 >= batch) return;
  const float coef = *coef_ptr;
  float mx[kVector], inv_sum[kVector];
  int64_t target[kVector];
#pragma unroll
  for (int v = 0; v < kVector; ++v) {
    mx[v] = row_max[b0 + v];
    inv_sum[v] = row_inv_sum[b0 + v];
    target[v] = target_col[b0 + v] - begin;
  }
  const int64_t tiles = (classes + tile_rows - 1) / tile_rows;
  for (int64_t tile = blockIdx.y; tile < tiles; tile += gridDim.y) {
    const int64_t first = tile * tile_rows;
    const int64_t last = min(classes, first + tile_rows);
    for (int64_t j = first; j < last; j += kUnroll) {
      Pack<float, kVector> rows[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (j + u < last) rows[u] = load_columns<kVector>(dot + (j + u) * batch + b0);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if (j + u >= last) continue;
        const float scale = row_scale != nullptr ? row_scale[j + u] : 1.0f;
        float grad[kVector];
#pragma unroll
        for (int v = 0; v < kVector; ++v) {
          float dz_dcos;
          const float z = logit(rows[u].e[v] * scale, j + u, target[v], params, &dz_dcos);
          const float p = __expf(z - mx[v]) * inv_sum[v] - (j + u == target[v] ? 1.0f : 0.0f);
          grad[v] = coef * p * dz_dcos * scale;
        }
        store_columns<kVector>(out + (j + u) * batch + b0, grad);
      }
    }
  }
}

// How a kernel covers [classes, batch]: kVector samples per thread across x, in blocks no wider
// than the batch; tiles of classes across y, grid-strided beyond the grid's y limit.
struct Launch {
  dim3 grid;
  dim3 block;
  int64_t tile_rows;
};

Launch launch_for(int64_t classes, int64_t batch, int vector) {
  const int64_t columns = (batch + vector - 1) / vector;
  const int64_t threads = std::min<int64_t>(kMaxThreads, (columns + 31) / 32 * 32);
  Launch l;
  l.tile_rows = softmax_tile_rows(classes, batch);
  const int64_t tiles = (classes + l.tile_rows - 1) / l.tile_rows;
  l.block = dim3(static_cast<unsigned>(threads));
  l.grid = dim3(static_cast<unsigned>((columns + threads - 1) / threads),
                static_cast<unsigned>(std::min<int64_t>(tiles, 65535)));
  return l;
}

// 16-byte accesses need every row, hence the batch, to be a multiple of 4 floats.
bool vectorizable(int64_t batch, const void* dot) {
  return batch % 4 == 0 && reinterpret_cast<uintptr_t>(dot) % 16 == 0;
}

template <int kVector, typename Out>
void launch_grad(const float* dot, const float* row_scale, int64_t classes, int64_t batch,
                 const int64_t* target_col, int64_t begin, const float* row_max,
                 const float* row_inv_sum, const float* coef, MarginParams params, Out* out,
                 cudaStream_t stream) {
  const Launch l = launch_for(classes, batch, kVector);
  chunk_grad_kernel<kVector>
      <<<l.grid, l.block, 0, stream>>>(dot, row_scale, classes, batch, target_col, begin, row_max,
                                       row_inv_sum, coef, params, l.tile_rows, out);
}

template <typename Out>
void launch_grad(const float* dot, const float* row_scale, int64_t classes, int64_t batch,
                 const int64_t* target_col, int64_t begin, const float* row_max,
                 const float* row_inv_sum, const float* coef, MarginParams params, Out* out,
                 cudaStream_t stream) {
  if (vectorizable(batch, dot) && reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    launch_grad<4>(dot, row_scale, classes, batch, target_col, begin, row_max, row_inv_sum, coef,
                   params, out, stream);
  } else {
    launch_grad<1>(dot, row_scale, classes, batch, target_col, begin, row_max, row_inv_sum, coef,
                   params, out, stream);
  }
}

}  // namespace

cudaError_t chunk_stats(const float* dot, const float* row_scale, int64_t classes, int64_t batch,
                        const int64_t* target_col, int64_t begin, MarginParams params,
                        float* tile_max, float* tile_sum, float* target_logit,
                        cudaStream_t stream) {
  if (classes == 0 || batch == 0) return cudaSuccess;
  if (vectorizable(batch, dot)) {
    const Launch l = launch_for(classes, batch, 4);
    chunk_stats_kernel<4><<<l.grid, l.block, 0, stream>>>(dot, row_scale, classes, batch,
                                                          target_col, begin, params, l.tile_rows,
                                                          tile_max, tile_sum, target_logit);
  } else {
    const Launch l = launch_for(classes, batch, 1);
    chunk_stats_kernel<1><<<l.grid, l.block, 0, stream>>>(dot, row_scale, classes, batch,
                                                          target_col, begin, params, l.tile_rows,
                                                          tile_max, tile_sum, target_logit);
  }
  return cudaGetLastError();
}

cudaError_t chunk_grad(const float* dot, const float* row_scale, int64_t classes, int64_t batch,
                       const int64_t* target_col, int64_t begin, const float* row_max,
                       const float* row_inv_sum, const float* coef, MarginParams params, void* out,
                       ElementType out_type, cudaStream_t stream) {
  if (classes == 0 || batch == 0) return cudaSuccess;
  with_element_type(out_type, [&](auto* out_tag) {
    launch_grad(dot, row_scale, classes, batch, target_col, begin, row_max, row_inv_sum, coef,
                params, static_cast<decltype(out_tag)>(out), stream);
  });
  return cudaGetLastError();
}

}  // namespace myriad::cuda
