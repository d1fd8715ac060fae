#include "myriad/util/check_mpi.h"

#include "myriad/util/error.h"

namespace myriad::detail {

void check_mpi(int rc, const char* expr, const char* file, int line) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) text[0] = '\0';
  throw_error(file, line, str_format("MPI call failed: {}: {} (code {})", expr, text, rc));
}

}  // namespace myriad::detail
