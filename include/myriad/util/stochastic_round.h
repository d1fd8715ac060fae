#pragma once

// Counter-based random bits and stochastic rounding to bfloat16, shared by host code and CUDA
// kernels; no LibTorch here so that nvcc can include it.

#include <cstdint>
#include <cstring>

#include "myriad/util/host_device.h"

namespace myriad {

// splitmix64's step and finaliser: a bijection of 64-bit values whose outputs pass as independent
// uniform bits for consecutive inputs.
MYRIAD_HD inline uint64_t splitmix64(uint64_t value) {
  uint64_t z = value + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The bfloat16 bits of `value` rounded stochastically: up to the next bfloat16 with probability
// equal to the fraction of the gap that `value` covers, using the low 16 bits of `random`. The
// rounded value's expectation is `value`, so updates far smaller than a bfloat16 step still move
// the weights on average (round-to-nearest would drop them all). NaN stays NaN, infinities stay.
MYRIAD_HD inline uint16_t bf16_bits_stochastic(float value, uint32_t random) {
  uint32_t bits;
#if defined(__CUDA_ARCH__)
  bits = __float_as_uint(value);
#else
  std::memcpy(&bits, &value, sizeof bits);
#endif
  if ((bits & 0x7F800000u) == 0x7F800000u) {
    // Keep a NaN quiet and non-zero in its upper half; infinity's low half is zero anyway.
    return static_cast<uint16_t>((bits >> 16) | ((bits & 0x007FFFFFu) != 0 ? 0x0040u : 0u));
  }
  return static_cast<uint16_t>((bits + (random & 0xFFFFu)) >> 16);
}

// A 32-bit integer hash with good avalanche (Chris Wellons' lowbias32); 32-bit multiplies keep it
// cheap in CUDA kernels, where 64-bit ones are emulated.
MYRIAD_HD inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  return x;
}

// One hash for the pair of elements 2 pair and 2 pair + 1 of a tensor rounded under `seed`.
MYRIAD_HD inline uint32_t pair_rounding_bits(uint64_t seed, int64_t pair) {
  const uint64_t key = seed + static_cast<uint64_t>(pair);
  return mix32(static_cast<uint32_t>(key) ^ mix32(static_cast<uint32_t>(key >> 32)));
}

// bfloat16 rounding takes 16 bits, so one hash serves two neighbouring elements: its upper half
// the even one, its lower half the odd one (bf16_bits_stochastic reads the low 16 bits).
MYRIAD_HD inline uint32_t pair_half(uint32_t hash, int64_t element) {
  return (element & 1) != 0 ? hash : hash >> 16;
}

// The random bits for element `element` of a tensor rounded under `seed` (derive one seed per
// update, so that every step draws afresh while any rank count or chunking draws the same bits).
// A kernel rounding whole rows pays a hash per pair (pair_half), which the fused weight update,
// bound by its arithmetic, feels.
MYRIAD_HD inline uint32_t rounding_bits(uint64_t seed, int64_t element) {
  return pair_half(pair_rounding_bits(seed, element >> 1), element);
}

}  // namespace myriad
