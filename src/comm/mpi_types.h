#pragma once

#include <mpi.h>
#include <torch/types.h>

#include "myriad/comm/communicator.h"

namespace myriad {

// MPI's view of torch dtypes. bfloat16 and float16 have no MPI arithmetic, so they travel as
// 2-byte types of their own with custom sum/max/min operations that convert each pair to float32,
// combine, and round back. The types and operations exist while at least one HalfTypesLease
// does (they must be freed before MPI_Finalize).
class HalfTypesLease {
 public:
  HalfTypesLease();
  ~HalfTypesLease();
  HalfTypesLease(const HalfTypesLease&) = delete;
  HalfTypesLease& operator=(const HalfTypesLease&) = delete;
};

MPI_Datatype mpi_datatype(torch::ScalarType dtype);
MPI_Op mpi_reduce_op(ReduceOp op, torch::ScalarType dtype);

}  // namespace myriad
