#include "mpi_test.h"

#include <mpi.h>

#include <vector>

namespace myriad::testing {

MpiTestEnvironment& environment() {
  static MpiTestEnvironment env;
  return env;
}

void MpiTest::TearDown() {
  int failed = HasFailure() ? 1 : 0;
  std::vector<int> all(world());
  MPI_Allgather(&failed, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
  std::string ranks;
  for (int r = 0; r < world(); ++r) {
    if (all[r] != 0) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!ranks.empty() && rank() == 0 && !HasFailure()) {
    ADD_FAILURE() << "failed on rank(s) " << ranks << " (their messages are on stderr)";
  }
}

void BackendTest::SetUp() {
  if (GetParam() == "nccl") {
    if (!environment().gpus)
      GTEST_SKIP() << "NCCL tests need a CUDA device on every rank and an NCCL build";
    device_ = environment().gpu;
  }
}

std::string backend_name(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

}  // namespace myriad::testing
