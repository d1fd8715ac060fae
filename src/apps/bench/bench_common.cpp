#include "bench_common.h"

#include <c10/util/Exception.h>

#include <new>

#include "myriad/util/error.h"

namespace myriad {

namespace {

// Dense matrix-product rate of this device in `dtype`: the compute-bound ceiling.
double measure_gemm_tflops(const torch::Device& device, torch::ScalarType dtype) {
  const int64_t n = device.is_cuda() ? 8192 : 1024;
  const auto options = torch::dtype(dtype).device(device);
  const torch::Tensor a = torch::randn({n, n}, options), b = torch::randn({n, n}, options);
  torch::Tensor c = torch::matmul(a, b);
  const int reps = device.is_cuda() ? 20 : 3;
  const double seconds = device_seconds(device, reps, [&] { c = torch::matmul(a, b); });
  return 2.0 * n * n * n * reps / seconds / 1e12;
}

// Bytes per second that a large device-to-device copy reads plus writes: the memory-bound ceiling.
double measure_memory_bandwidth(const torch::Device& device) {
  const int64_t bytes = device.is_cuda() ? (int64_t{1} << 30) : (int64_t{64} << 20);
  const auto options = torch::dtype(torch::kUInt8).device(device);
  const torch::Tensor src = torch::ones({bytes}, options);
  torch::Tensor dst = torch::empty({bytes}, options);
  dst.copy_(src);
  const int reps = device.is_cuda() ? 20 : 3;
  const double seconds = device_seconds(device, reps, [&] { dst.copy_(src); });
  return 2.0 * static_cast<double>(bytes) * reps / seconds;
}

}  // namespace

Ceilings measure_ceilings(const torch::Device& device, torch::ScalarType gemm_dtype) {
  const Ceilings ceilings{measure_gemm_tflops(device, gemm_dtype),
                          measure_memory_bandwidth(device)};
  release_cached_memory(device);
  reset_peak_device_memory(device);
  return ceilings;
}

RankSpread spread_over_ranks(double value, const ProcessContext& context) {
  RankSpread s;
  MYRIAD_CHECK_MPI(MPI_Allreduce(&value, &s.min, 1, MPI_DOUBLE, MPI_MIN, context.world()));
  MYRIAD_CHECK_MPI(MPI_Allreduce(&value, &s.max, 1, MPI_DOUBLE, MPI_MAX, context.world()));
  MYRIAD_CHECK_MPI(MPI_Allreduce(&value, &s.avg, 1, MPI_DOUBLE, MPI_SUM, context.world()));
  s.avg /= context.size();
  return s;
}

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr ||
      dynamic_cast<const std::bad_alloc*>(&e) != nullptr) {
    return true;
  }
  // LibTorch's CPU allocator ("can't allocate memory" in 1.x, "not enough memory" in 2.x) and
  // CUDA's runtime outside the caching allocator (cuBLAS's and cuDNN's own buffers) refuse with a
  // plain c10::Error: its message is all there is.
  const std::string what = e.what();
  for (const char* refusal :
       {"DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory",
        "CUDA error: out of memory"}) {
    if (what.find(refusal) != std::string::npos) return true;
  }
  return false;
}

void fits_on_every_rank(const ProcessContext& context, const std::string& what,
                        const std::string& remedy, const std::function<void()>& work) {
  bool fits = true;
  try {
    work();
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) throw;
    fits = false;
  }
  MYRIAD_CHECK_COLLECTIVE(context.all_true(fits),
                          "{} does not fit in memory on every rank (an allocation was refused): {}",
                          what, remedy);
}

}  // namespace myriad
