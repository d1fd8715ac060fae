#pragma once

// Elementwise float32 functions written so that the compiler vectorises the loops that call them:
// no branches, no library calls, no undefined conversions.

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

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

}  // namespace myriad
