#pragma once

#ifdef MYRIAD_WITH_NCCL
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <memory>

#include "myriad/comm/communicator.h"

namespace myriad {

// CUDA tensors over NCCL, on one GPU per rank. The unique id travels by MPI_Bcast. Every
// operation is enqueued on LibTorch's current CUDA stream, so it is ordered with the caller's
// kernels and needs no extra synchronisation. When an NCCL call fails the communicator is
// aborted (ncclCommAbort), so no rank stays blocked inside NCCL, and an Error is thrown. The hang
// watchdog aborts it too before it ends the job, and names the first of its operations that the
// GPU has not finished: each is followed by an end event on its stream (as c10d's WorkNCCL has),
// also inside a CUDA graph being recorded, where the event is recorded again at every replay.
class NcclCommunicator final : public Communicator {
 public:
  // max_ctas > 0 caps the CTAs of each of its kernels (ncclConfig_t::maxCTAs); 0 is NCCL's default.
  NcclCommunicator(MPI_Comm comm, torch::Device device, int max_ctas = 0);
  ~NcclCommunicator() override;

  const char* backend() const override { return "nccl"; }
  torch::Device device() const override { return device_; }
  bool capturable() const override { return true; }
  ncclComm_t handle() const { return comm_; }

 protected:
  void all_reduce_impl(torch::Tensor& tensor, ReduceOp op) override;
  void all_gather_impl(const torch::Tensor& input, torch::Tensor& output,
                       const std::vector<int64_t>& counts, bool equal) override;
  void reduce_scatter_impl(const torch::Tensor& input, torch::Tensor& output,
                           const std::vector<int64_t>& counts, bool equal, ReduceOp op) override;
  void broadcast_impl(torch::Tensor& tensor, int root) override;
  void gather_impl(const torch::Tensor& input, torch::Tensor& output,
                   const std::vector<int64_t>& counts, int root) override;
  void scatter_impl(const torch::Tensor& input, torch::Tensor& output,
                    const std::vector<int64_t>& counts, int root) override;
  void barrier_impl() override;
  void p2p_impl(const std::vector<torch::Tensor>& sent, const std::vector<torch::Tensor>& received,
                int peer) override;

 private:
  class Trail;
  // Checks the communicator is usable and returns the stream to enqueue on; the caller holds a
  // CUDAGuard for device_.
  cudaStream_t begin() const;
  // Runs an NCCL call; on failure aborts the communicator and throws with NCCL's message.
  void check(ncclResult_t rc, const char* expr, const char* file, int line);

  torch::Device device_;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  int watchdog_abort_ = -1;  // HangWatchdog::register_abort's id
  std::unique_ptr<Trail> trail_;
};

}  // namespace myriad
#endif
