#include "myriad/util/hash_random.h"

#include <cmath>

#include "myriad/util/stochastic_round.h"

namespace myriad {

namespace {

// Logical right shift on int64 tensors: LibTorch shifts signed values arithmetically.
torch::Tensor shift_right(const torch::Tensor& z, int bits) {
  const int64_t mask = static_cast<int64_t>((uint64_t{1} << (64 - bits)) - 1);
  return z.bitwise_right_shift(bits).bitwise_and_(mask);
}

// splitmix64's finaliser on int64 tensors (multiplication wraps modulo 2^64).
torch::Tensor mix(const torch::Tensor& keys, uint64_t seed) {
  torch::Tensor z = keys.to(torch::kInt64) + static_cast<int64_t>(mix64(seed));
  z = z.bitwise_xor(shift_right(z, 30)).mul_(static_cast<int64_t>(0xBF58476D1CE4E5B9ull));
  z = z.bitwise_xor(shift_right(z, 27)).mul_(static_cast<int64_t>(0x94D049BB133111EBull));
  return z.bitwise_xor(shift_right(z, 31));
}

torch::Tensor bits24(const torch::Tensor& z, int shift) {
  return shift_right(z, shift).bitwise_and_(0xFFFFFF).to(torch::kFloat32);
}

}  // namespace

uint64_t mix64(uint64_t value) {
  return splitmix64(value);
}

torch::Tensor hash_uniform(const torch::Tensor& keys, uint64_t seed) {
  return bits24(mix(keys, seed), 40).mul_(1.0f / 16777216.0f);
}

torch::Tensor hash_normal(const torch::Tensor& keys, uint64_t seed) {
  const torch::Tensor z = mix(keys, seed);
  // Both uniforms lie strictly inside (0, 1), so the logarithm is finite.
  const torch::Tensor u1 = bits24(z, 40).add_(0.5f).mul_(1.0f / 16777216.0f);
  const torch::Tensor u2 = bits24(z, 8).add_(0.5f).mul_(1.0f / 16777216.0f);
  return u1.log_().mul_(-2.0f).sqrt_().mul_(u2.mul_(static_cast<float>(2.0 * M_PI)).cos_());
}

}  // namespace myriad
