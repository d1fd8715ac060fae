#pragma once

// What the standalone GPU check programs of the Hopper kernels share: CUDA error checks that end
// the program, the mode they run in, and the timing of a launch.

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "../../src/classifier/cuda/hopper/fused_softmax.h"

#define CHECK(x)                                                                                \
  do {                                                                                          \
    const cudaError_t rc_ = (x);                                                                \
    if (rc_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(rc_)); \
      std::exit(1);                                                                             \
    }                                                                                           \
  } while (0)

namespace myriad::testing {

// The program's mode, argv[1] ("check" when absent); ends the program with CTest's skip code, 77,
// where the GPU does not run the fused kernels.
inline std::string mode_on_hopper(int argc, char** argv) {
  if (!myriad::cuda::fused_softmax_runs_on(0)) {
    std::printf("SKIP: the fused kernels need a compute capability 9.0 GPU\n");
    std::exit(77);
  }
  return argc > 1 ? argv[1] : "check";
}

// Mean ms of `reps` calls of f after one that warms up.
template <class F>
float time_ms(F f, int reps) {
  f();
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  CHECK(cudaEventRecord(start));
  for (int i = 0; i < reps; ++i) f();
  CHECK(cudaEventRecord(stop));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return ms / reps;
}

}  // namespace myriad::testing
