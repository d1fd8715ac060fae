// Row kernels over the weight shard: the GEMM copy of a chunk's rows, and the optimizer updates
// fused with the backward of the row normalisation, one warp per row.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels.h"

namespace myriad::cuda {

namespace {

constexpr int kRowsPerBlock = 8;
constexpr int kThreads = kRowsPerBlock * 32;
constexpr float kMinSquaredNorm = 1e-24f;

__device__ inline float load(const float* p) {
  return *p;
}
__device__ inline float load(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}
__device__ inline void store(float* p, float v) {
  *p = v;
}
__device__ inline void store(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16(v);
}
__device__ inline void store(__half* p, float v) {
  *p = __float2half(v);
}

__device__ inline float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}

struct RowSlot {
  int64_t row;  // which of the `count` rows, or -1 past the end
  int64_t src;  // its row in the shard
  int lane;
};

__device__ inline RowSlot row_slot(const int64_t* index, int64_t begin, int64_t count) {
  RowSlot slot;
  slot.row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  slot.lane = threadIdx.x % 32;
  if (slot.row >= count) {
    slot.row = -1;
    return slot;
  }
  slot.src = index != nullptr ? index[begin + slot.row] : begin + slot.row;
  return slot;
}

template <typename Out>
__global__ void prepare_rows_kernel(const float* __restrict__ weight, int64_t dim,
                                    const int64_t* __restrict__ index, int64_t begin, int64_t count,
                                    bool normalize, Out* __restrict__ out) {
  const RowSlot slot = row_slot(index, begin, count);
  if (slot.row < 0) return;
  const float* w = weight + slot.src * dim;
  float scale = 1.0f;
  if (normalize) {
    float squares = 0.0f;
    for (int64_t k = slot.lane; k < dim; k += 32) squares += w[k] * w[k];
    scale = rsqrtf(fmaxf(warp_sum(squares), kMinSquaredNorm));
  }
  Out* o = out + slot.row * dim;
  for (int64_t k = slot.lane; k < dim; k += 32) store(o + k, w[k] * scale);
}

// dw for one element: the gradient with respect to the row itself. For normalised rows, grad is
// dL/d(w/|w|) and dw = grad/|w| - (w.grad) w/|w|^3.
struct RowGradient {
  float inv_norm = 1.0f;
  float radial = 0.0f;  // (w.grad) / |w|^3
  bool normalized = false;
  float multiplier = 1.0f;

  __device__ float operator()(float w, float g) const {
    g *= multiplier;
    return normalized ? g * inv_norm - radial * w : g;
  }
};

__device__ inline RowGradient row_gradient(const float* w, const float* g, int64_t dim, int lane,
                                           bool normalized, float multiplier) {
  RowGradient rg;
  rg.normalized = normalized;
  rg.multiplier = multiplier;
  if (!normalized) return rg;
  float squares = 0.0f, dot = 0.0f;
  for (int64_t k = lane; k < dim; k += 32) {
    squares += w[k] * w[k];
    dot += w[k] * g[k];
  }
  squares = fmaxf(warp_sum(squares), kMinSquaredNorm);
  dot = warp_sum(dot) * multiplier;
  rg.inv_norm = rsqrtf(squares);
  rg.radial = dot * rg.inv_norm * rg.inv_norm * rg.inv_norm;
  return rg;
}

template <typename State>
__global__ void sgd_rows_kernel(float* __restrict__ weight, State* __restrict__ momentum,
                                const float* __restrict__ grad, int64_t dim,
                                const int64_t* __restrict__ index, int64_t begin, int64_t count,
                                bool normalized, SgdArgs args) {
  const RowSlot slot = row_slot(index, begin, count);
  if (slot.row < 0) return;
  float* w = weight + slot.src * dim;
  const float* g = grad + slot.row * dim;
  const RowGradient dw = row_gradient(w, g, dim, slot.lane, normalized, args.grad_multiplier);
  State* buf = momentum != nullptr ? momentum + slot.src * dim : nullptr;
  for (int64_t k = slot.lane; k < dim; k += 32) {
    const float wk = w[k];
    float d = dw(wk, g[k]) + args.weight_decay * wk;
    if (buf != nullptr) {
      const float b = args.momentum * load(buf + k) + d;
      store(buf + k, b);
      d = args.nesterov ? d + args.momentum * b : b;
    }
    w[k] = wk - args.lr * d;
  }
}

template <typename State>
__global__ void adamw_rows_kernel(float* __restrict__ weight, State* __restrict__ exp_avg,
                                  State* __restrict__ exp_avg_sq, const float* __restrict__ grad,
                                  int64_t dim, const int64_t* __restrict__ index, int64_t begin,
                                  int64_t count, bool normalized, AdamWArgs args) {
  const RowSlot slot = row_slot(index, begin, count);
  if (slot.row < 0) return;
  float* w = weight + slot.src * dim;
  const float* g = grad + slot.row * dim;
  const RowGradient dw = row_gradient(w, g, dim, slot.lane, normalized, args.grad_multiplier);
  State* m = exp_avg + slot.src * dim;
  State* v = exp_avg_sq + slot.src * dim;
  const float step = args.lr / args.bias_correction1;
  const float inv_sqrt_bc2 = rsqrtf(args.bias_correction2);
  for (int64_t k = slot.lane; k < dim; k += 32) {
    const float wk = w[k];
    const float gk = dw(wk, g[k]);
    const float mk = args.beta1 * load(m + k) + (1.0f - args.beta1) * gk;
    const float vk = args.beta2 * load(v + k) + (1.0f - args.beta2) * gk * gk;
    store(m + k, mk);
    store(v + k, vk);
    w[k] = wk * (1.0f - args.lr * args.weight_decay) -
           step * mk / (sqrtf(vk) * inv_sqrt_bc2 + args.eps);
  }
}

unsigned blocks_for(int64_t count) {
  return static_cast<unsigned>((count + kRowsPerBlock - 1) / kRowsPerBlock);
}

}  // namespace

cudaError_t prepare_rows(const float* weight, int64_t dim, const int64_t* index, int64_t begin,
                         int64_t count, bool normalize, void* out, ElementType out_type,
                         cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  switch (out_type) {
    case ElementType::kFloat32:
      prepare_rows_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
          weight, dim, index, begin, count, normalize, static_cast<float*>(out));
      break;
    case ElementType::kBFloat16:
      prepare_rows_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
          weight, dim, index, begin, count, normalize, static_cast<__nv_bfloat16*>(out));
      break;
    case ElementType::kFloat16:
      prepare_rows_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
          weight, dim, index, begin, count, normalize, static_cast<__half*>(out));
      break;
  }
  return cudaGetLastError();
}

cudaError_t sgd_rows(float* weight, void* momentum, ElementType momentum_type, const float* grad,
                     int64_t dim, const int64_t* index, int64_t begin, int64_t count,
                     bool normalized, SgdArgs args, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (momentum_type == ElementType::kBFloat16) {
    sgd_rows_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
        weight, static_cast<__nv_bfloat16*>(momentum), grad, dim, index, begin, count, normalized,
        args);
  } else {
    sgd_rows_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
        weight, static_cast<float*>(momentum), grad, dim, index, begin, count, normalized, args);
  }
  return cudaGetLastError();
}

cudaError_t adamw_rows(float* weight, void* exp_avg, void* exp_avg_sq, ElementType state_type,
                       const float* grad, int64_t dim, const int64_t* index, int64_t begin,
                       int64_t count, bool normalized, AdamWArgs args, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  if (state_type == ElementType::kBFloat16) {
    adamw_rows_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
        weight, static_cast<__nv_bfloat16*>(exp_avg), static_cast<__nv_bfloat16*>(exp_avg_sq), grad,
        dim, index, begin, count, normalized, args);
  } else {
    adamw_rows_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
        weight, static_cast<float*>(exp_avg), static_cast<float*>(exp_avg_sq), grad, dim, index,
        begin, count, normalized, args);
  }
  return cudaGetLastError();
}

}  // namespace myriad::cuda
