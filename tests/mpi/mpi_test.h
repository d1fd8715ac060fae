#pragma once

#include <gtest/gtest.h>

#include <torch/types.h>

#include <string>

#include "myriad/comm/comm_factory.h"
#include "myriad/comm/process_context.h"
#include "support/exact_float32.h"

namespace myriad::testing {

// Process-wide state of the multi-rank test binary, created by its main().
struct MpiTestEnvironment {
  ProcessContext* context = nullptr;
  CommFactory* comms = nullptr;
  bool gpus = false;  // every rank has a CUDA device and NCCL is built
  torch::Device gpu{torch::kCPU};
};
MpiTestEnvironment& environment();

// Base fixture for every multi-rank test: after each test the ranks agree on whether any of them
// failed, so rank 0 (the only one that prints) reports failures seen on other ranks, and every
// rank ends the test in the same state.
class MpiTest : public ::testing::Test {
 protected:
  void TearDown() override;

  ProcessContext& context() { return *environment().context; }
  int rank() { return context().rank(); }
  int world() { return context().size(); }
  Communicator& comm(const torch::Device& device) {
    return environment().comms->for_device(device);
  }
};

// For tests parameterised over the backends: "mpi" (CPU) and "nccl" (CUDA, skipped without GPUs).
class BackendTest : public MpiTest, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override;
  torch::Device device() const { return device_; }
  Communicator& comm() { return MpiTest::comm(device_); }

 private:
  torch::Device device_{torch::kCPU};
};

std::string backend_name(const ::testing::TestParamInfo<std::string>& info);

}  // namespace myriad::testing
