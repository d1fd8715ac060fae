#pragma once

#include <mpi.h>

namespace myriad::detail {
void check_mpi(int rc, const char* expr, const char* file, int line);
}

// Communicators are set to MPI_ERRORS_RETURN, so failures reach this check and become Errors
// that carry the rank, the host, the call and MPI's own error string.
#define MYRIAD_CHECK_MPI(call) ::myriad::detail::check_mpi((call), #call, __FILE__, __LINE__)
