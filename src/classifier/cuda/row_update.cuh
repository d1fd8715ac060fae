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
  // rounding_bits of elements element + j: one hash per pair where the pack starts a pair.
  template <int N>
  __device__ void operator()(__nv_bfloat16* p, const float (&v)[N], int64_t element) const {
    if constexpr (N % 2 == 0) {
      if (element % 2 == 0) {
        even_pack(p, v, element);
        return;
      }
    }
    store(p, v, [&](int j) { return rounding_bits(rounding_seed, element + j); });
  }
  // operator()'s bits for a pack that starts on an even element, which the caller guarantees
  // (the fused update's packs of 8 columns, in rows of a multiple of 8): one hash per pair, with
  // the hash of the key's upper half taken once per pack (twice where the lower half wraps within
  // it). The fused update is bound by this arithmetic, and leaving out operator()'s parity test
  // made it 30% faster (docs/measurements/2026-11-29-h200-pair-rounding-bits/).
  template <int N>
  __device__ void even_pack(__nv_bfloat16* p, const float (&v)[N], int64_t element) const {
    static_assert(N % 2 == 0, "a pack of pairs");
    const uint64_t key = rounding_seed + static_cast<uint64_t>(element / 2);
    const uint32_t low = static_cast<uint32_t>(key), high = static_cast<uint32_t>(key >> 32);
    const uint32_t upper = mix32(high);
    // The pack starts on an even element, so element j's half of its pair's hash is j's.
    if (low <= ~uint32_t{0} - (N / 2 - 1)) {
      store(p, v, [&](int j) {
        return pair_half(mix32((low + static_cast<uint32_t>(j / 2)) ^ upper), j);
      });
    } else {
      const uint32_t next = mix32(high + 1);
      store(p, v, [&](int j) {
        const uint32_t lower = low + static_cast<uint32_t>(j / 2);
        return pair_half(mix32(lower ^ (lower < low ? next : upper)), j);
      });
    }
  }
  // Element j rounded with bits_of(j): where the pack holds no NaN, the upper halves of its bits
  // plus the random ones, two elements to a word.
  template <int N, class Bits>
  __device__ static void store(__nv_bfloat16* p, const float (&v)[N], Bits bits_of) {
    Pack<__nv_bfloat16, N> pack;
    bool nan = false;
#pragma unroll
    for (int j = 0; j < N; ++j) nan |= v[j] != v[j];
    if constexpr (N % 2 == 0) {
      if (!nan) {
        auto* words = reinterpret_cast<uint32_t*>(&pack);
#pragma unroll
        for (int j = 0; j < N / 2; ++j) {
          const uint32_t even = __float_as_uint(v[2 * j]) + (bits_of(2 * j) & 0xFFFFu);
          const uint32_t odd = __float_as_uint(v[2 * j + 1]) + (bits_of(2 * j + 1) & 0xFFFFu);
          words[j] = __byte_perm(even, odd, 0x7632);
        }
        store_pack<N>(p, pack);
        return;
      }
    }
#pragma unroll
    for (int j = 0; j < N; ++j)
      pack.e[j] = __ushort_as_bfloat16(bf16_bits_stochastic(v[j], bits_of(j)));
    store_pack<N>(p, pack);
  }
};

// dw for one element: the gradient with respect to the row itself. For grad = dL/d(w/|w|),
// dw = grad/|w| - (w.grad) w/|w|^3; for grad = dL/d(w/|w|) / |w|, dw = grad - (w.grad) w/|w|^2.
struct RowGradientOf {
  float gain = 1.0f;    // of grad: the multiplier that undoes loss scaling, times 1/|w| or 1
  float radial = 0.0f;  // of w

  __device__ float operator()(float w, float g) const { return fmaf(g, gain, -radial * w); }
};

// The row's RowGradientOf from the sums over its elements of w.grad (`dot`) and w^2 (`squares`);
// `multiplier` undoes loss scaling (1 when null).
__device__ inline RowGradientOf row_gradient_of(float dot, float squares, RowGradient grad_of,
                                                const float* multiplier) {
  RowGradientOf rg;
  if (multiplier != nullptr) rg.gain = *multiplier;
  if (grad_of == RowGradient::kRow) return rg;
  dot *= rg.gain;
  const float inv_norm = rsqrtf(fmaxf(squares, kMinSquaredNorm));
  if (grad_of == RowGradient::kUnitRow) {
    rg.gain *= inv_norm;
    rg.radial = dot * inv_norm * inv_norm * inv_norm;
  } else {
    rg.radial = dot * inv_norm * inv_norm;
  }
  return rg;
}

// SGD on one element w with gradient g (as torch.optim.SGD: weight decay added to the gradient,
// then momentum `b`, when the row has a buffer, and Nesterov); returns the new w. kNesterov as a
// constant spares the fused update computing both forms and selecting one.
template <bool kNesterov>
__device__ inline float sgd_element(float w, float g, const RowGradientOf& dw, const SgdArgs& args,
                                    float* b) {
  float d = fmaf(g, dw.gain, (args.weight_decay - dw.radial) * w);
  if (b != nullptr) {
    *b = fmaf(args.momentum, *b, d);
    d = kNesterov ? fmaf(args.momentum, *b, d) : *b;
  }
  return fmaf(-args.lr, d, w);
}
__device__ inline float sgd_element(float w, float g, const RowGradientOf& dw, const SgdArgs& args,
                                    float* b) {
  return args.nesterov ? sgd_element<true>(w, g, dw, args, b)
                       : sgd_element<false>(w, g, dw, args, b);
}

}  // namespace myriad::cuda
