#pragma once

#include <gtest/gtest.h>

#include <ATen/Context.h>
#include <torch/types.h>

#include <string>

#include "myriad/comm/comm_factory.h"
#include "myriad/comm/process_context.h"

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
// Plain fp32 on the GPU while it lives: cuDNN convolutions default to TF32, whose 10-bit mantissa
// puts a GPU gradient ~1e-3 away from the CPU reference.
class ExactFloat32 {
 public:
  ExactFloat32()
      : cudnn_(at::globalContext().allowTF32CuDNN()),
        cublas_(at::globalContext().allowTF32CuBLAS()) {
    at::globalContext().setAllowTF32CuDNN(false);
    at::globalContext().setAllowTF32CuBLAS(false);
  }
  ~ExactFloat32() {
    at::globalContext().setAllowTF32CuDNN(cudnn_);
    at::globalContext().setAllowTF32CuBLAS(cublas_);
  }

 private:
  bool cudnn_;
  bool cublas_;
};

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
