#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

#include "myriad/util/element_type.h"

namespace myriad {

// Waits for the work queued on `device`'s current stream; a no-op on the CPU.
void synchronize_device(const torch::Device& device);

// Peak bytes the caching allocator has handed out on `device` since the last reset, and the
// reset itself. On the CPU both report 0: LibTorch keeps no CPU statistics.
int64_t peak_device_memory(const torch::Device& device);
// Peak bytes the caching allocator has held on `device` (handed out or cached for reuse): what
// another allocation cannot have.
int64_t peak_reserved_device_memory(const torch::Device& device);
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

// Opens or closes the CUDA profiler's capture range (cudaProfilerStart/Stop), which
// `nsys --capture-range=cudaProfilerApi` and `ncu --profile-from-start off` follow; a no-op on
// the CPU.
void set_profiler_capture(const torch::Device& device, bool on);

// Whether `device` computes in bfloat16 at full speed: a CUDA GPU of compute capability 8.0
// (Ampere) or later. False on the CPU, where autocast to bfloat16 is slower than float32.
bool has_fast_bfloat16(const torch::Device& device);

// The floating-point type an option names: fp32, bf16 or fp16 (or float32, bfloat16, float16);
// anything else is a UsageError.
torch::ScalarType parse_float_dtype(const std::string& name);
// How options spell float32, bfloat16 and float16: fp32, bf16, fp16; an error for other types.
const char* float_dtype_name(torch::ScalarType dtype);

// The element type of myriad's CUDA kernels that `dtype` is; an error for other types.
cuda::ElementType element_type(torch::ScalarType dtype);

// Sets LibTorch's intra-op threads: `requested`, or with 0 this host's cores shared among its
// `ranks_on_host` ranks (at least one each), so that the ranks of a host do not oversubscribe it.
void set_torch_threads(int requested, int ranks_on_host);

// Puts cuDNN and cuBLAS in their deterministic modes (no autotuning, fixed cuBLAS workspace) so
// that a run repeats bit for bit on the same GPUs. Call it before the first GEMM.
void use_deterministic_algorithms();

// How convolutions pick their algorithms: cuDNN's and cuBLAS's deterministic modes
// (use_deterministic_algorithms); cuDNN times the candidate engines of each convolution shape once
// and keeps the fastest (its benchmark mode); or cuDNN takes its heuristics' first choice.
enum class ConvolutionEngines { kDeterministic, kTimed, kHeuristic };

// Sets LibTorch's global modes for `engines`, before the first convolution. Returns how `device`'s
// convolutions pick their algorithms, for start-up lines.
const char* use_convolution_engines(ConvolutionEngines engines, const torch::Device& device);

}  // namespace myriad
