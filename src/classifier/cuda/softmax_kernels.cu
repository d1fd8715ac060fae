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
    // Online max and sum of exponentials over the tile's classes, kUnroll rows' loads in flight.
    float m[kVector], s[kVector];
#pragma unroll
    for (int v = 0; v < kVector; ++v) m[v] = -INFINITY, s[v] = 0.0f;
    for_each_row<kUnroll>(
        first, last, 1, [&](int64_t j) { return load_pack<kVector>(dot + j * batch + b0); },
        [&](int64_t j, const Pack<float, kVector>& row) {
          const float scale = row_scale != nullptr ? row_scale[j] : 1.0f;
#pragma unroll
          for (int v = 0; v < kVector; ++v) {
            float unused;
            const float z = logit(row.e[v] * scale, j, target[v], params, &unused);
            if (j == target[v]) target_logit[b0 + v] = z;
            if (z > m[v]) {
              s[v] = s[v] * __expf(m[v] - z) + 1.0f;
              m[v] = z;
            } else {
              s[v] += __expf(z - m[v]);
            }
          }
        });
    store_floats<kVector>(tile_max + tile * batch + b0, m);
    store_floats<kVector>(tile_sum + tile * batch + b0, s);
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
    for_each_row<kUnroll>(
        first, last, 1, [&](int64_t j) { return load_pack<kVector>(dot + j * batch + b0); },
        [&](int64_t j, const Pack<float, kVector>& row) {
          const float scale = row_scale != nullptr ? row_scale[j] : 1.0f;
          float grad[kVector];
#pragma unroll
          for (int v = 0; v < kVector; ++v) {
            float dz_dcos;
            const float z = logit(row.e[v] * scale, j, target[v], params, &dz_dcos);
            const float p = __expf(z - mx[v]) * inv_sum[v] - (j == target[v] ? 1.0f : 0.0f);
            grad[v] = coef * p * dz_dcos * scale;
          }
          store_floats<kVector>(out + j * batch + b0, grad);
        });
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

// 16-byte reads of the logits need every row, hence the batch, to be a multiple of 4 floats.
constexpr int kWide = 4;

template <typename Out>
void launch_grad(const float* dot, const float* row_scale, int64_t classes, int64_t batch,
                 const int64_t* target_col, int64_t begin, const float* row_max,
                 const float* row_inv_sum, const float* coef, MarginParams params, Out* out,
                 cudaStream_t stream) {
  const bool wide =
      packs_fit(batch, kWide, dot, sizeof(float)) && packs_fit(batch, kWide, out, sizeof(Out));
  with_pack_width<kWide>(wide, [&](auto width) {
    constexpr int kVector = decltype(width)::value;
    const Launch l = launch_for(classes, batch, kVector);
    chunk_grad_kernel<kVector>
        <<<l.grid, l.block, 0, stream>>>(dot, row_scale, classes, batch, target_col, begin, row_max,
                                         row_inv_sum, coef, params, l.tile_rows, out);
  });
}

}  // namespace

cudaError_t chunk_stats(const float* dot, const float* row_scale, int64_t classes, int64_t batch,
                        const int64_t* target_col, int64_t begin, MarginParams params,
                        float* tile_max, float* tile_sum, float* target_logit,
                        cudaStream_t stream) {
  if (classes == 0 || batch == 0) return cudaSuccess;
  with_pack_width<kWide>(packs_fit(batch, kWide, dot, sizeof(float)), [&](auto width) {
    constexpr int kVector = decltype(width)::value;
    const Launch l = launch_for(classes, batch, kVector);
    chunk_stats_kernel<kVector>
        <<<l.grid, l.block, 0, stream>>>(dot, row_scale, classes, batch, target_col, begin, params,
                                         l.tile_rows, tile_max, tile_sum, target_logit);
  });
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
