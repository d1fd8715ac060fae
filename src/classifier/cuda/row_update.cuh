#pragma once

// The stores of updated weights, shared by the row kernels (weight_kernels.cu) and the fused
// weight update (hopper/fused_weight_update.cu), so that both paths round a row alike, down to the
// bits; the arithmetic itself is row_update_rule.h's. nvcc only.

#include <cstdint>

#include "../row_update_rule.h"
#include "kernels.h"
#include "myriad/util/cuda_elements.cuh"
#include "myriad/util/stochastic_round.h"

namespace myriad::cuda {

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

}  // namespace myriad::cuda
