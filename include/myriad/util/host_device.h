#pragma once

// Marks functions that host code and CUDA kernels share, in headers nvcc compiles.
#if defined(__CUDACC__)
#define MYRIAD_HD __host__ __device__
#else
#define MYRIAD_HD
#endif
