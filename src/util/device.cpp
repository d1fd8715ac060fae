#include "myriad/util/device.h"

#include <ATen/Context.h>

#include <cstdlib>

#ifdef MYRIAD_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

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

void use_deterministic_algorithms() {
  // cuBLAS splits reductions by its workspace; a fixed configuration makes the splits repeat.
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setBenchmarkCuDNN(false);
  at::globalContext().setDeterministicCuDNN(true);
  // Ops without a deterministic implementation warn instead of failing the run.
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
}

}  // namespace myriad
