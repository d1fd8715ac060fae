#pragma once

#ifdef MYRIAD_WITH_CUDA
#include <cuda_runtime_api.h>

namespace myriad::detail {
void check_cuda(cudaError_t rc, const char* expr, const char* file, int line);
}

#define MYRIAD_CHECK_CUDA(call) ::myriad::detail::check_cuda((call), #call, __FILE__, __LINE__)
#endif
