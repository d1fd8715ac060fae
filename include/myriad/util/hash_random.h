#pragma once

#include <torch/types.h>

#include <cstdint>

namespace myriad {

// Counter-based pseudo-random numbers: the value drawn for key k depends only on (seed, k). Any
// rank, device or chunking draws the same numbers for the same keys, which keeps classifier
// initialisation and Partial FC sampling identical across world sizes, CPU and GPU.

// splitmix64 of `value`, for deriving seeds on the host.
uint64_t mix64(uint64_t value);

// Uniform in [0, 1) with 24-bit resolution, float32, one per int64 key, on the keys' device.
torch::Tensor hash_uniform(const torch::Tensor& keys, uint64_t seed);

// Standard normal, float32, one per int64 key (Box-Muller over two 24-bit uniforms).
torch::Tensor hash_normal(const torch::Tensor& keys, uint64_t seed);

}  // namespace myriad
