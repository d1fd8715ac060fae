#pragma once

// What myriad's CUDA kernels share: element conversions, packed accesses and the choice of their
// width, the walk over a thread's rows, and the multiprocessor count; nvcc only.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "myriad/util/element_type.h"

namespace myriad::cuda {

// Kernels compute in float32 whatever the tensors hold.
__device__ inline float to_float(float v) {
  return v;
}
__device__ inline float to_float(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
__device__ inline float to_float(__half v) {
  return __half2float(v);
}

// Round to nearest even into the tensor's type.
template <typename T>
__device__ inline T from_float(float v);
template <>
__device__ inline float from_float<float>(float v) {
  return v;
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}
template <>
__device__ inline __half from_float<__half>(float v) {
  return __float2half(v);
}

// N elements of T moved as one access of N * sizeof(T) bytes: the memory system serves one 8- or
// 16-byte load far better than several narrow ones. The caller guarantees the alignment.
template <typename T, int N>
struct alignas(N * sizeof(T)) Pack {
  T e[N];
};

template <int N, typename T>
__device__ inline Pack<T, N> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, N>*>(p);
}

template <int N, typename T>
__device__ inline void store_pack(T* p, const Pack<T, N>& v) {
  *reinterpret_cast<Pack<T, N>*>(p) = v;
}

// A pack's elements in float32. bfloat16 pairs come apart with one integer operation each (a
// shift for the lower, a mask for the upper), where element-wise conversion takes two.
template <int N, typename T>
__device__ inline void to_floats(const Pack<T, N>& pack, float (&v)[N]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> && N % 2 == 0) {
    const auto* words = reinterpret_cast<const uint32_t*>(&pack);
#pragma unroll
    for (int j = 0; j < N / 2; ++j) {
      v[2 * j] = __uint_as_float(words[j] << 16);
      v[2 * j + 1] = __uint_as_float(words[j] & 0xFFFF0000u);
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = to_float(pack.e[j]);
  }
}

// N elements from one access, in float32.
template <int N, typename T>
__device__ inline void load_floats(const T* p, float (&v)[N]) {
  to_floats(load_pack<N>(p), v);
}

// N float32 values rounded into T and stored as one access.
template <int N, typename T>
__device__ inline void store_floats(T* p, const float (&v)[N]) {
  Pack<T, N> pack;
#pragma unroll
  for (int j = 0; j < N; ++j) pack.e[j] = from_float<T>(v[j]);
  store_pack<N>(p, pack);
}

// Whether rows of `row_elements` elements of the array at `pointer` (of `element_bytes` each) can
// be accessed n elements at a time: the rows' length is a multiple of n and the array starts on a
// boundary of n elements.
inline bool packs_fit(int64_t row_elements, int n, const void* pointer, int element_bytes) {
  return row_elements % n == 0 && reinterpret_cast<uintptr_t>(pointer) % (n * element_bytes) == 0;
}

// Calls f(std::integral_constant<int, N>) when `wide` (packs_fit holds for every array), else
// f(std::integral_constant<int, 1>): the pack width as a compile-time constant for the kernel's
// template. Returns what f returns.
template <int N, typename F>
inline auto with_pack_width(bool wide, F&& f) {
  return wide ? f(std::integral_constant<int, N>{}) : f(std::integral_constant<int, 1>{});
}

// A thread's rows first, first + step, ... below `end`, kAtOnce at a time: read(r) loads row r's
// data for each of the kAtOnce rows before use(r, data) consumes them, so that their loads are in
// flight together (one row's load at a time leaves the memory system idle between them).
template <int kAtOnce, class Read, class Use>
__device__ inline void for_each_row(int64_t first, int64_t end, int64_t step, Read&& read,
                                    Use&& use) {
  using Data = decltype(read(int64_t{0}));
  for (int64_t r = first; r < end; r += kAtOnce * step) {
    Data data[kAtOnce];
#pragma unroll
    for (int u = 0; u < kAtOnce; ++u) {
      if (r + u * step < end) data[u] = read(r + u * step);
    }
#pragma unroll
    for (int u = 0; u < kAtOnce; ++u) {
      if (r + u * step < end) use(r + u * step, data[u]);
    }
  }
}

// The current device's multiprocessors, asked of the driver once per device (launches size their
// grids with it, and a buffer sized by it must agree with the launch that fills it).
inline int multiprocessors() {
  constexpr int kMaxDevices = 64;
  static std::array<std::atomic<int>, kMaxDevices> counts{};
  const auto check = [](cudaError_t status, const char* what) {
    if (status != cudaSuccess)
      throw std::runtime_error(std::string(what) + " failed: " + cudaGetErrorString(status));
  };
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  if (device < 0 || device >= kMaxDevices) {
    throw std::runtime_error("CUDA device index " + std::to_string(device) + " is beyond the " +
                             std::to_string(kMaxDevices) + " supported");
  }
  int count = counts[device].load(std::memory_order_relaxed);
  if (count == 0) {
    check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device),
          "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");
    counts[device].store(count, std::memory_order_relaxed);
  }
  return count;
}

// Calls f with a null pointer of the C++ type that `type` names, which picks the instantiation of
// a kernel; returns what f returns.
template <typename F>
inline auto with_element_type(ElementType type, F&& f) {
  switch (type) {
    case ElementType::kBFloat16:
      return f(static_cast<__nv_bfloat16*>(nullptr));
    case ElementType::kFloat16:
      return f(static_cast<__half*>(nullptr));
    case ElementType::kFloat32:
      break;
  }
  return f(static_cast<float*>(nullptr));
}

}  // namespace myriad::cuda
