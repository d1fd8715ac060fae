#pragma once

// Elementwise float32 functions written so that the compiler vectorises the loops that call them:
// no branches, no library calls, no undefined conversions.

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "myriad/util/cpu_clones.h"

namespace myriad {

inline uint32_t float_bits(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

inline float bits_float(uint32_t bits) {
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}

// exp(x) as Cephes' expf computes it, 2^n e^r with |r| <= ln 2 / 2, within 2 ulp of the true
// value over float's normal range. Below -87.3 it gives about 1e-38 instead of underflowing, which
// no sum of exponentials notices; NaN stays NaN.
inline float vector_exp(float x) {
  constexpr float kRound = 12582912.0f;  // 1.5 2^23: adding it rounds to an integer
  const float clamped = std::min(std::max(x, -87.3f), 88.0f);
  const float shifted = clamped * 1.44269504088896341f + kRound;
  const float n = shifted - kRound;
  // ln 2 in two parts, so that n ln 2 is exact to float's precision.
  const float r = clamped - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n from n's bits in `shifted`, an integer operation (converting a NaN float is undefined).
  const uint32_t power = (float_bits(shifted) - float_bits(kRound) + 127u) << 23;
  return p * bits_float(power);
}

// The bfloat16 bits of `v` rounded to nearest, ties to even, as LibTorch rounds finite values;
// NaN stays NaN.
inline uint16_t bf16_bits_nearest(float v) {
  const uint32_t bits = float_bits(v);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(nan ? (bits >> 16) | 0x0040u : rounded);
}

// Stores float32 `v` into a float32 element, or a bfloat16 or float16 one rounded to nearest.
inline void store_rounded(float* p, float v) {
  *p = v;
}
inline void store_rounded(c10::BFloat16* p, float v) {
  p->x = bf16_bits_nearest(v);
}
inline void store_rounded(c10::Half* p, float v) {
  *p = c10::Half(v);
}

// Sixteen float32 lanes: one AVX-512 register, two or four in the narrower clones (cpu_clones.h).
using SumLanes = float __attribute__((vector_size(64)));
constexpr int kSumLanes = 16;

// Elements [0, 16) of a row as float32 lanes.
template <typename T>
MYRIAD_INLINE_LOOP void load_lanes(SumLanes& lanes, const T* row) {
  float v[kSumLanes];
  for (int j = 0; j < kSumLanes; ++j) v[j] = static_cast<float>(row[j]);
  std::memcpy(&lanes, v, sizeof lanes);
}

// The lanes' total: the upper half added onto the lower, four times (a fixed order).
MYRIAD_INLINE_LOOP float lane_total(SumLanes& l) {
  l += __builtin_shufflevector(l, l, 8, 9, 10, 11, 12, 13, 14, 15, 8, 9, 10, 11, 12, 13, 14, 15);
  l += __builtin_shufflevector(l, l, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7, 4, 5, 6, 7);
  l += __builtin_shufflevector(l, l, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3);
  l += __builtin_shufflevector(l, l, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1);
  return l[0];
}

// A row's sums of a.a and, where kDot, a.b, over `dim` elements, element k in lane k % 16. Partial
// sums that GCC kept in a float array were scalarised, and a row's sums cost more than its update.
struct RowSums {
  float squares = 0.0f, dot = 0.0f;
};

template <bool kDot, typename A, typename B>
MYRIAD_INLINE_LOOP RowSums sum_products(const A* a, const B* b, int64_t dim) {
  SumLanes squares = {}, dot = {}, x, y;
  int64_t k = 0;
  for (; k + kSumLanes <= dim; k += kSumLanes) {
    load_lanes(x, a + k);
    squares += x * x;
    if constexpr (kDot) {
      load_lanes(y, b + k);
      dot += x * y;
    }
  }
  for (int j = 0; k + j < dim; ++j) {
    const float v = static_cast<float>(a[k + j]);
    squares[j] += v * v;
    if constexpr (kDot) dot[j] += v * static_cast<float>(b[k + j]);
  }
  return {lane_total(squares), lane_total(dot)};
}

template <typename A, typename B>
MYRIAD_INLINE_LOOP RowSums row_sums(const A* a, const B* b, int64_t dim) {
  return sum_products<true>(a, b, dim);
}

template <typename A>
MYRIAD_INLINE_LOOP float row_squares(const A* a, int64_t dim) {
  return sum_products<false>(a, a, dim).squares;
}

}  // namespace myriad
