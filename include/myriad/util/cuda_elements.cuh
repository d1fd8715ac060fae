#pragma once

// Element conversions and packed accesses that myriad's CUDA kernels share; nvcc only.

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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
