#pragma once

// The element types myriad's CUDA kernels take, named without LibTorch so that nvcc-compiled
// launchers and host code share one list (myriad::element_type maps a LibTorch dtype to it).

namespace myriad::cuda {

enum class ElementType { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2 };

}  // namespace myriad::cuda
