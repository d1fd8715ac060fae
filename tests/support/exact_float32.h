#pragma once

#include <ATen/Context.h>

namespace myriad::testing {

// Plain fp32 on the GPU while it lives: cuDNN convolutions default to TF32, whose 10-bit mantissa
// puts a GPU gradient ~1e-3 away from the CPU reference.
class ExactFloat32 {
 public:
  ExactFloat32()
      : cudnn_(at::globalContext().allowTF32CuDNN()),
        cublas_(at::globalContext().allowTF32CuBLAS()) {
    at::globalContext().setAllowTF32CuDNN(false);
    at::globalContext().setAllowTF32CuBLAS(false);
  }
  ~ExactFloat32() {
    at::globalContext().setAllowTF32CuDNN(cudnn_);
    at::globalContext().setAllowTF32CuBLAS(cublas_);
  }

 private:
  bool cudnn_;
  bool cublas_;
};

}  // namespace myriad::testing
