// Test main for the multi-rank binary: initialises MPI through ProcessContext, lets only rank 0
// print GoogleTest's report (other ranks print their failures, tagged with their rank), makes
// every rank exit with the same code, and ends the job when an exception escapes a test.

#include <gtest/gtest.h>
#include <mpi.h>
#include <torch/torch.h>

#include <cstdio>
#include <string>

#include "mpi_test.h"
#include "myriad/comm/comm_factory.h"
#include "myriad/comm/process_context.h"

namespace {

// On ranks other than 0: print failed assertions only, prefixed with the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.message());
  }

 private:
  int rank_;
};

// An exception that escapes a test on one rank leaves the others waiting in that test's next
// collective, until ctest's timeout (5 minutes of a GPU node's time, once). With more than one
// rank the job ends at once instead, after the failure is printed.
class AbortOnEscapedException : public ::testing::EmptyTestEventListener {
 public:
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    const std::string message = result.message();
    const bool escaped =
        message.rfind("C++ exception", 0) == 0 || message.rfind("Unknown C++ exception", 0) == 0;
    if (!result.fatally_failed() || !escaped) return;
    std::fprintf(stderr, "an exception escaped a test: ending every rank\n");
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  myriad::ProcessContext context(&argc, &argv);
  torch::set_num_threads(1);
  auto& env = myriad::testing::environment();
  env.context = &context;
#ifdef MYRIAD_WITH_NCCL
  // NCCL needs one GPU per rank: with more ranks on a node than GPUs, the NCCL tests skip.
  env.gpus = context.all_true(torch::cuda::device_count() >= context.local_size());
#endif
  if (env.gpus) env.gpu = context.select_device(myriad::DevicePreference::kCuda);

  int code = 0;
  {
    myriad::CommFactory comms(context);
    env.comms = &comms;
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    if (context.rank() != 0) {
      delete listeners.Release(listeners.default_result_printer());
      listeners.Append(new RankFailurePrinter(context.rank()));
    } else {
      std::printf("[ myriad ] %d rank(s); NCCL tests %s\n", context.size(),
                  env.gpus ? "enabled" : "skipped (no GPU on every rank, or no NCCL build)");
    }
    // Appended last: the failure is printed before the job ends.
    if (context.size() > 1) listeners.Append(new AbortOnEscapedException);
    int local = RUN_ALL_TESTS();
    MPI_Allreduce(&local, &code, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    env.comms = nullptr;
  }
  return code;
}
