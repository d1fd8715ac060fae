#include "myriad/util/check_cuda.h"

#ifdef MYRIAD_WITH_CUDA
#include "myriad/util/error.h"

namespace myriad::detail {

void check_cuda(cudaError_t rc, const char* expr, const char* file, int line) {
  if (rc == cudaSuccess) return;
  throw_error(file, line,
              str_format("CUDA call failed: {}: {} ({})", expr, cudaGetErrorString(rc),
                         cudaGetErrorName(rc)));
}

}  // namespace myriad::detail
#endif
