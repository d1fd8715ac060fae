#include "myriad/util/check_nccl.h"

#ifdef MYRIAD_WITH_NCCL
#include "myriad/util/error.h"

namespace myriad::detail {

void check_nccl(ncclResult_t rc, ncclComm_t comm, const char* expr, const char* file, int line) {
  if (rc == ncclSuccess) return;
  std::string detail = ncclGetErrorString(rc);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && last[0] != '\0') detail += std::string(": ") + last;
  throw_error(file, line, str_format("NCCL call failed: {}: {}", expr, detail));
}

}  // namespace myriad::detail
#endif
