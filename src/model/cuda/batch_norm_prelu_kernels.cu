// Batch norm + PReLU in two passes over the data each way (batch_norm_prelu_kernels.h).
//
// Each thread moves kVector elements of one row at a time: 16 bytes, one load or store, which the
// memory system serves far better than narrower ones. That needs channels % kVector == 0 and
// 16-byte aligned data (every IResNet width); otherwise one element at a time.

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "batch_norm_prelu_kernels.h"
#include "myriad/util/cuda_elements.cuh"

namespace myriad::cuda {

namespace {

constexpr int kThreads = 256;

// One channel's constants: x̂ = x a + b (a = invstd, b = -mean invstd), z = x̂ gamma + beta.
struct Channel {
  float a, b, gamma, beta, alpha;
};

__device__ inline Channel channel(const BatchNormPReLUParams& p, int64_t c) {
  const float invstd = p.invstd[c];
  return {invstd, -p.mean[c] * invstd, p.gamma[c], p.beta[c], p.alpha[c * p.alpha_stride]};
}

template <typename T, int V>
__global__ void batch_norm_prelu_forward_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                int64_t packs, int64_t channels,
                                                BatchNormPReLUParams p) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c0 = (i * V) % channels;
    const Pack<T, V> in = reinterpret_cast<const Pack<T, V>*>(x)[i];
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const Channel ch = channel(p, c0 + k);
      const float z = (to_float(in.e[k]) * ch.a + ch.b) * ch.gamma + ch.beta;
      out.e[k] = from_float<T>(z > 0.0f ? z : ch.alpha * z);
    }
    reinterpret_cast<Pack<T, V>*>(y)[i] = out;
  }
}

template <typename T, int V>
__global__ void batch_norm_prelu_backward_input_kernel(const T* __restrict__ x,
                                                       const T* __restrict__ dy, T* __restrict__ dx,
                                                       int64_t packs, int64_t channels,
                                                       float inv_rows, BatchNormPReLUParams p,
                                                       const float* __restrict__ sums) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c0 = (i * V) % channels;
    const Pack<T, V> xs = reinterpret_cast<const Pack<T, V>*>(x)[i];
    const Pack<T, V> gs = reinterpret_cast<const Pack<T, V>*>(dy)[i];
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      const int64_t c = c0 + k;
      const Channel ch = channel(p, c);
      const float xhat = to_float(xs.e[k]) * ch.a + ch.b;
      const float z = xhat * ch.gamma + ch.beta;
      const float g = to_float(gs.e[k]);
      const float dz = z > 0.0f ? g : ch.alpha * g;
      const float mean_dz = sums[c] * inv_rows, mean_dz_xhat = sums[channels + c] * inv_rows;
      out.e[k] = from_float<T>(ch.gamma * ch.a * (dz - mean_dz - xhat * mean_dz_xhat));
    }
    reinterpret_cast<Pack<T, V>*>(dx)[i] = out;
  }
}

// A block is threads (tx, ty): tx packs of channels side by side, ty rows, so that a warp reads
// whole rows' consecutive bytes. Each thread sums its rows in registers, the block sums over ty in
// shared memory, and the block's row of partials [3, channels] leaves it.
template <typename T, int V>
__global__ void batch_norm_prelu_backward_reduce_kernel(const T* __restrict__ x,
                                                        const T* __restrict__ dy, int64_t rows,
                                                        int64_t channels, BatchNormPReLUParams p,
                                                        float* __restrict__ partials) {
  extern __shared__ float partial[];  // [ty][tx][3 V]
  const int64_t packs_per_row = channels / V;
  const int64_t pack = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  float s[3][V] = {};
  if (pack < packs_per_row) {
    Channel ch[V];
#pragma unroll
    for (int k = 0; k < V; ++k) ch[k] = channel(p, pack * V + k);
    for (int64_t r = blockIdx.y * static_cast<int64_t>(blockDim.y) + threadIdx.y; r < rows;
         r += static_cast<int64_t>(gridDim.y) * blockDim.y) {
      const int64_t i = r * packs_per_row + pack;
      const Pack<T, V> xs = reinterpret_cast<const Pack<T, V>*>(x)[i];
      const Pack<T, V> gs = reinterpret_cast<const Pack<T, V>*>(dy)[i];
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const float xhat = to_float(xs.e[k]) * ch[k].a + ch[k].b;
        const float z = xhat * ch[k].gamma + ch[k].beta;
        const float g = to_float(gs.e[k]);
        const float dz = z > 0.0f ? g : ch[k].alpha * g;
        s[0][k] += dz;
        s[1][k] += dz * xhat;
        s[2][k] += z > 0.0f ? 0.0f : g * z;
      }
    }
  }
  float* mine = partial + (threadIdx.y * blockDim.x + threadIdx.x) * 3 * V;
#pragma unroll
  for (int j = 0; j < 3; ++j) {
#pragma unroll
    for (int k = 0; k < V; ++k) mine[j * V + k] = s[j][k];
  }
  __syncthreads();
  // blockDim.y is a power of two.
  for (unsigned half = blockDim.y / 2; half > 0; half /= 2) {
    if (threadIdx.y < half) {
      const float* other = mine + half * blockDim.x * 3 * V;
      for (int j = 0; j < 3 * V; ++j) mine[j] += other[j];
    }
    __syncthreads();
  }
  if (threadIdx.y == 0 && pack < packs_per_row) {
    float* out = partials + blockIdx.y * 3 * channels;
#pragma unroll
    for (int j = 0; j < 3; ++j) {
#pragma unroll
      for (int k = 0; k < V; ++k) out[j * channels + pack * V + k] = mine[j * V + k];
    }
  }
}

// sums[i] = Σ_b partials[b][i] over the row blocks, in order.
__global__ void batch_norm_prelu_sum_partials_kernel(const float* __restrict__ partials,
                                                     int64_t blocks, int64_t width,
                                                     float* __restrict__ sums) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < width;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (int64_t b = 0; b < blocks; ++b) s += partials[b * width + i];
    sums[i] = s;
  }
}

int multiprocessors() {
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    return 108;
  }
  return count;
}

// Blocks for an elementwise pass over `packs` packs: enough to fill the GPU a few times over.
unsigned elementwise_blocks(int64_t packs) {
  const int64_t wanted = (packs + kThreads - 1) / kThreads;
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>(wanted, 8 * multiprocessors())));
}

bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Calls `launch` with the element type and the widest pack that the data allow.
template <class Launch>
cudaError_t dispatch(ElementType type, int64_t channels,
                     std::initializer_list<const void*> pointers, Launch&& launch) {
  bool wide = true;
  for (const void* p : pointers) wide = wide && aligned(p);
  return with_element_type(type, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    constexpr int kWide = 16 / sizeof(T);
    return wide && channels % kWide == 0 ? launch(T{}, std::integral_constant<int, kWide>{})
                                         : launch(T{}, std::integral_constant<int, 1>{});
  });
}

}  // namespace

cudaError_t batch_norm_prelu_forward(const void* x, void* y, ElementType type, int64_t rows,
                                     int64_t channels, BatchNormPReLUParams p,
                                     cudaStream_t stream) {
  return dispatch(type, channels, {x, y}, [&](auto t, auto v) {
    using T = decltype(t);
    constexpr int V = decltype(v)::value;
    const int64_t packs = rows * channels / V;
    if (packs == 0) return cudaSuccess;
    batch_norm_prelu_forward_kernel<T, V><<<elementwise_blocks(packs), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<T*>(y), packs, channels, p);
    return cudaGetLastError();
  });
}

// The reduction's block shape and grid for a pack width of V elements.
struct ReduceShape {
  unsigned tx, ty, gx, gy;
};

ReduceShape reduce_shape(int64_t rows, int64_t packs_per_row) {
  ReduceShape s;
  s.tx = static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(packs_per_row, 32)));
  s.ty = 1;
  while (s.ty * 2 * s.tx <= kThreads) s.ty *= 2;
  s.gx = static_cast<unsigned>((packs_per_row + s.tx - 1) / s.tx);
  const int64_t row_blocks = std::max<int64_t>(1, (rows + s.ty - 1) / s.ty);
  s.gy = static_cast<unsigned>(std::min<int64_t>(row_blocks, 4 * multiprocessors() / s.gx + 1));
  return s;
}

int64_t batch_norm_prelu_partials(int64_t channels) {
  // reduce_shape's most row blocks, whatever the pack width.
  return (4 * static_cast<int64_t>(multiprocessors()) + 1) * 3 * channels;
}

cudaError_t batch_norm_prelu_backward_reduce(const void* x, const void* dy, ElementType type,
                                             int64_t rows, int64_t channels, BatchNormPReLUParams p,
                                             float* partials, float* sums, cudaStream_t stream) {
  return dispatch(type, channels, {x, dy}, [&](auto t, auto v) {
    using T = decltype(t);
    constexpr int V = decltype(v)::value;
    const int64_t packs_per_row = channels / V;
    if (packs_per_row == 0) return cudaSuccess;
    const ReduceShape s = reduce_shape(rows, packs_per_row);
    const size_t shared = static_cast<size_t>(s.tx) * s.ty * 3 * V * sizeof(float);
    batch_norm_prelu_backward_reduce_kernel<T, V>
        <<<dim3(s.gx, s.gy), dim3(s.tx, s.ty), shared, stream>>>(
            static_cast<const T*>(x), static_cast<const T*>(dy), rows, channels, p, partials);
    const int64_t width = 3 * channels;
    batch_norm_prelu_sum_partials_kernel<<<static_cast<unsigned>((width + kThreads - 1) / kThreads),
                                           kThreads, 0, stream>>>(partials, s.gy, width, sums);
    return cudaGetLastError();
  });
}

cudaError_t batch_norm_prelu_backward_input(const void* x, const void* dy, void* dx,
                                            ElementType type, int64_t rows, int64_t channels,
                                            BatchNormPReLUParams p, const float* sums,
                                            cudaStream_t stream) {
  return dispatch(type, channels, {x, dy, dx}, [&](auto t, auto v) {
    using T = decltype(t);
    constexpr int V = decltype(v)::value;
    const int64_t packs = rows * channels / V;
    if (packs == 0) return cudaSuccess;
    batch_norm_prelu_backward_input_kernel<T, V>
        <<<elementwise_blocks(packs), kThreads, 0, stream>>>(
            static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), packs,
            channels, 1.0f / static_cast<float>(rows), p, sums);
    return cudaGetLastError();
  });
}

}  // namespace myriad::cuda
