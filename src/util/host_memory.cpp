#include "myriad/util/host_memory.h"

// <cstdint> first: it brings in the C library's own header, which defines __GLIBC__.
#include <cstdint>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "myriad/util/error.h"

namespace myriad {

void keep_freed_host_memory() {
#if defined(__GLIBC__)
  // No allocation from mmap (one too large for a thread's arena still gets one), and no trimming
  // of the heap's top.
  MYRIAD_CHECK(mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, INT32_MAX) == 1,
               "mallopt refused to keep freed host memory");
#endif
}

}  // namespace myriad
