#pragma once

// The optimizer's per-row and per-element arithmetic, shared by the row kernels
// (weight_kernels.cu) and the fused weight update (hopper/fused_weight_update.cu), so that both
// paths update a row alike, down to the bits of its stochastic rounding; nvcc only.

#include <cstdint>

#include "kernels.h"
#include "myriad/util/cuda_elements.cuh"
#include "myriad/util/stochastic_round.h"

namespace myriad::cuda {

constexpr float kMinSquaredNorm = 1e-24f;

// Stores of updated weights: float32 as they are, bfloat16 rounded stochastically with the bits
// of each element's global index.
struct WeightStore {
  int64_t first_row;
  uint64_t rounding_seed;

  template <int N>
  __device__ void operator()(float* p, const float (&v)[N], int64_t) const {
    store_floats(p, v);
  }
  // rounding_bits of elements element + j, with the hash of the key's upper half taken once per
  // pack (twice where the lower half wraps within it): the same bits at half the arithmetic.
  template <int N>
  __device__ void operator()(__nv_bfloat16* p, const float (&v)[N], int64_t element) const {
    const uint64_t key = rounding_seed + static_cast<uint64_t>(element);
    const uint32_t low = static_cast<uint32_t>(key), high = static_cast<uint32_t>(key >> 32);
    const uint32_t upper[2] = {mix32(high), mix32(high + 1)};
    Pack<__nv_bfloat16, N> pack;
#pragma unroll
    for (int j = 0; j < N; ++j) {
      const uint32_t lower = low + static_cast<uint32_t>(j);
      const uint32_t bits = mix32(lower ^ upper[lower < low ? 1 : 0]);
      pack.e[j] = __ushort_as_bfloat16(bf16_bits_stochastic(v[j], bits));
    }
    store_pack<N>(p, pack);
  }
};

// dw for one element: the gradient with respect to the row itself. For grad = dL/d(w/|w|),
// dw = grad/|w| - (w.grad) w/|w|^3; for grad = dL/d(w/|w|) / |w|, dw = grad - (w.grad) w/|w|^2.
struct RowGradientOf {
  float scale = 1.0f;   // of grad
  float radial = 0.0f;  // of w
  float multiplier = 1.0f;

  __device__ float operator()(float w, float g) const {
    return g * multiplier * scale - radial * w;
  }
};

// The row's RowGradientOf from the sums over its elements of w.grad (`dot`) and w^2 (`squares`);
// `multiplier` undoes loss scaling (1 when null).
__device__ inline RowGradientOf row_gradient_of(float dot, float squares, RowGradient grad_of,
                                                const float* multiplier) {
  RowGradientOf rg;
  if (multiplier != nullptr) rg.multiplier = *multiplier;
  if (grad_of == RowGradient::kRow) return rg;
  dot *= rg.multiplier;
  const float inv_norm = rsqrtf(fmaxf(squares, kMinSquaredNorm));
  if (grad_of == RowGradient::kUnitRow) {
    rg.scale = inv_norm;
    rg.radial = dot * inv_norm * inv_norm * inv_norm;
  } else {
    rg.radial = dot * inv_norm * inv_norm;
  }
  return rg;
}

// SGD on one element w with gradient g (as torch.optim.SGD: weight decay added to the gradient,
// then momentum `b`, when the row has a buffer, and Nesterov); returns the new w.
__device__ inline float sgd_element(float w, float g, const RowGradientOf& dw, const SgdArgs& args,
                                    float* b) {
  float d = dw(w, g) + args.weight_decay * w;
  if (b != nullptr) {
    *b = args.momentum * *b + d;
    d = args.nesterov ? d + args.momentum * *b : *b;
  }
  return w - args.lr * d;
}

}  // namespace myriad::cuda
