#pragma once

#include <memory>

#include "myriad/comm/communicator.h"

namespace myriad {

class ProcessContext;

// What a new communicator of its own may differ in.
struct CommOptions {
  // The most CTAs (thread blocks) that one NCCL kernel of the communicator takes; 0 leaves it to
  // NCCL. A collective's kernel holds its SMs from its launch to its end, waiting on the GPU for
  // its peers too, so a communicator whose collectives wait beside other work gets few. MPI
  // communicators ignore it.
  int max_ctas = 0;
};

// Owns this rank's communicators and hands out the one that moves tensors of a given device:
// MPI for CPU tensors, NCCL for CUDA tensors. The NCCL communicator is created on first use,
// which every rank reaches together because it is the first CUDA collective.
class CommFactory {
 public:
  explicit CommFactory(const ProcessContext& context);
  ~CommFactory();
  CommFactory(const CommFactory&) = delete;
  CommFactory& operator=(const CommFactory&) = delete;

  Communicator& for_device(const torch::Device& device);
  Communicator& for_tensor(const torch::Tensor& tensor) { return for_device(tensor.device()); }
  Communicator& mpi() { return *mpi_; }
  // A new communicator of its own for `device` (a collective call), for traffic that runs
  // concurrently with the shared one, such as gradient buckets on their own CUDA stream.
  std::unique_ptr<Communicator> create(const torch::Device& device,
                                       const CommOptions& options = {}) const;
  // A communicator of its own among the ranks that pass the same `color`, ranked by `key` (a
  // collective call over all ranks): MPI_Comm_split, and for CUDA an NCCL communicator over it by
  // ncclCommInitRank, which every NCCL that myriad supports has (ncclCommSplit needs 2.18).
  std::unique_ptr<Communicator> create_split(const torch::Device& device, int color, int key) const;

 private:
  const ProcessContext& context_;
  std::unique_ptr<Communicator> mpi_;
  std::unique_ptr<Communicator> nccl_;
};

}  // namespace myriad
