#include "myriad/util/device.h"

#include <ATen/Context.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "myriad/util/error.h"

#ifdef MYRIAD_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_profiler_api.h>

#include "myriad/util/check_cuda.h"
#endif

namespace myriad {

void synchronize_device(const torch::Device& device) {
#ifdef MYRIAD_WITH_CUDA
  if (device.is_cuda()) c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
#endif
}

int64_t peak_device_memory(const torch::Device& device) {
#ifdef MYRIAD_WITH_CUDA
  if (device.is_cuda()) {
    // Entry 0 of each statistic is the aggregate over pools in every LibTorch version; the
    // enum naming it moved between namespaces.
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[0].peak;
  }
#endif
  return 0;
}

int64_t peak_reserved_device_memory(const torch::Device& device) {
#ifdef MYRIAD_WITH_CUDA
  if (device.is_cuda()) {
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device.index()).reserved_bytes[0].peak;
  }
#endif
  return 0;
}

int64_t allocated_device_memory(const torch::Device& device) {
#ifdef MYRIAD_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[0].current;
  }
#endif
  return 0;
}

void reset_peak_device_memory(const torch::Device& device) {
#ifdef MYRIAD_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

DeviceMemory device_memory(const torch::Device& device) {
  DeviceMemory memory;
#ifdef MYRIAD_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard guard(device);
    size_t free = 0, total = 0;
    MYRIAD_CHECK_CUDA(cudaMemGetInfo(&free, &total));
    memory.free = static_cast<int64_t>(free);
    memory.total = static_cast<int64_t>(total);
  }
#endif
  return memory;
}

void release_cached_memory(const torch::Device& device) {
#ifdef MYRIAD_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

void set_profiler_capture(const torch::Device& device, bool on) {
#ifdef MYRIAD_WITH_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard guard(device);
    MYRIAD_CHECK_CUDA(on ? cudaProfilerStart() : cudaProfilerStop());
  }
#endif
}

bool has_fast_bfloat16(const torch::Device& device) {
#ifdef MYRIAD_WITH_CUDA
  if (device.is_cuda()) {
    int major = 0;
    MYRIAD_CHECK_CUDA(
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device.index()));
    return major >= 8;
  }
#endif
  (void)device;
  return false;
}

torch::ScalarType parse_float_dtype(const std::string& name) {
  if (name == "fp32" || name == "float32") return torch::kFloat32;
  if (name == "bf16" || name == "bfloat16") return torch::kBFloat16;
  if (name == "fp16" || name == "float16") return torch::kFloat16;
  throw UsageError(str_format("unknown floating-point type '{}' (fp32, bf16, fp16)", name));
}

const char* float_dtype_name(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32:
      return "fp32";
    case torch::kBFloat16:
      return "bf16";
    case torch::kFloat16:
      return "fp16";
    default:
      MYRIAD_THROW("no option names {} (float32, bfloat16 or float16)", c10::toString(dtype));
  }
}

cuda::ElementType element_type(torch::ScalarType dtype) {
  switch (dtype) {
    case torch::kFloat32:
      return cuda::ElementType::kFloat32;
    case torch::kBFloat16:
      return cuda::ElementType::kBFloat16;
    case torch::kFloat16:
      return cuda::ElementType::kFloat16;
    default:
      MYRIAD_THROW("no CUDA kernel takes {} (float32, bfloat16 or float16)", c10::toString(dtype));
  }
}

void set_torch_threads(int requested, int ranks_on_host) {
  at::set_num_threads(
      requested > 0
          ? requested
          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ranks_on_host));
}

void use_deterministic_algorithms() {
  // cuBLAS splits reductions by its workspace; a fixed configuration makes the splits repeat.
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setBenchmarkCuDNN(false);
  at::globalContext().setDeterministicCuDNN(true);
  // Ops without a deterministic implementation warn instead of failing the run.
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
}

const char* use_convolution_engines(ConvolutionEngines engines, const torch::Device& device) {
  if (engines == ConvolutionEngines::kDeterministic) {
    use_deterministic_algorithms();
    return "deterministic algorithms";
  }
  const bool timed = engines == ConvolutionEngines::kTimed;
  at::globalContext().setBenchmarkCuDNN(timed);
  if (!device.is_cuda()) return "oneDNN's convolutions";
  return timed ? "cuDNN's engines timed per shape" : "cuDNN's heuristic engines";
}

}  // namespace myriad
