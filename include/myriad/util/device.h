#pragma once

#include <torch/types.h>

#include <cstdint>

namespace myriad {

// Waits for the work queued on `device`'s current stream; a no-op on the CPU.
void synchronize_device(const torch::Device& device);

// Peak bytes the caching allocator has handed out on `device` since the last reset, and the
// reset itself. On the CPU both report 0: LibTorch keeps no CPU statistics.
int64_t peak_device_memory(const torch::Device& device);
// Bytes LibTorch's caching allocator has handed out on a CUDA device now (0 on the CPU).
int64_t allocated_device_memory(const torch::Device& device);
void reset_peak_device_memory(const torch::Device& device);

struct DeviceMemory {
  int64_t free = 0;
  int64_t total = 0;
};
// The device's free and total memory (cudaMemGetInfo); zeros on the CPU.
DeviceMemory device_memory(const torch::Device& device);

// Returns the allocator's cached blocks to the device (between benchmark cases).
void release_cached_memory(const torch::Device& device);

// Puts cuDNN and cuBLAS in their deterministic modes (no autotuning, fixed cuBLAS workspace) so
// that a run repeats bit for bit on the same GPUs. Call it before the first GEMM.
void use_deterministic_algorithms();

}  // namespace myriad
