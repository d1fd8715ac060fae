#pragma once

#include <memory>

#include "myriad/comm/communicator.h"

namespace myriad {

class HalfTypesLease;

// CPU tensors over MPI. This is the backend every machine without a GPU runs, through the same
// multi-rank code paths as NCCL.
class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;

  const char* backend() const override { return "mpi"; }
  torch::Device device() const override { return torch::kCPU; }

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
  MPI_Comm comm_ = MPI_COMM_NULL;
  std::unique_ptr<HalfTypesLease> half_types_;
};

}  // namespace myriad
