#pragma once

#ifdef MYRIAD_WITH_NCCL
#include <nccl.h>

namespace myriad::detail {
void check_nccl(ncclResult_t rc, ncclComm_t comm, const char* expr, const char* file, int line);
}

// `comm` (may be null) is queried for an asynchronous error to make the message precise.
#define MYRIAD_CHECK_NCCL(call, comm) \
  ::myriad::detail::check_nccl((call), (comm), #call, __FILE__, __LINE__)
#endif
